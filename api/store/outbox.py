"""The callback outbox: one durable delivery per job, retried with backoff until delivered or
given up (what is pending survives a restart)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.store.engine import StoreEngine
from api.store.tables import CallbackOutbox

DeliveryStatus = Literal["pending", "delivered", "gave_up"]


def backoff_delay(attempts: int, base_seconds: float, cap_seconds: float = 300.0) -> float:
    """Exponential backoff after ``attempts`` failed deliveries: base, 2*base, 4*base, ... capped."""
    return min(cap_seconds, base_seconds * (2 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class CallbackDelivery:
    delivery_id: str
    version_id: str
    url: str
    payload: dict[str, Any]
    attempts: int
    next_attempt_at: float | None
    status: str
    last_error: str | None
    created_at: float
    delivered_at: float | None


def _delivery_record(row: CallbackOutbox) -> CallbackDelivery:
    return CallbackDelivery(
        delivery_id=row.delivery_id,
        version_id=row.version_id,
        url=row.url,
        payload=row.payload,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        status=row.status,
        last_error=row.last_error,
        created_at=row.created_at,
        delivered_at=row.delivered_at,
    )


def add_delivery(s: Session, version_id: str, url: str, payload: dict[str, Any], now: float) -> str:
    """In the caller's transaction: the job's callback, due at once (one per job: an existing
    delivery's id is returned and nothing changes)."""
    existing = s.scalars(select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)).first()
    if existing is not None:
        return existing.delivery_id
    row = CallbackOutbox(
        delivery_id=uuid.uuid4().hex,
        version_id=version_id,
        url=url,
        payload=payload,
        attempts=0,
        next_attempt_at=now,
        status="pending",
        created_at=now,
    )
    s.add(row)
    s.flush()
    return row.delivery_id


class OutboxStore(StoreEngine):
    def enqueue_callback(
        self, version_id: str, url: str, payload: dict[str, Any], *, now: float | None = None
    ) -> str:
        """Schedule the job's callback (due at once). One delivery per job: a second call returns the
        first delivery's id and changes nothing."""
        now = time.time() if now is None else now
        try:
            with self._write() as s:
                return add_delivery(s, version_id, url, payload, now)
        except IntegrityError:
            with self._read() as s:
                found = s.scalars(
                    select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)
                ).first()
                if found is None:
                    raise
                return found.delivery_id

    def get_callback(self, delivery_id: str) -> CallbackDelivery | None:
        with self._read() as s:
            row = s.get(CallbackOutbox, delivery_id)
            return _delivery_record(row) if row is not None else None

    def callback_for(self, version_id: str) -> CallbackDelivery | None:
        with self._read() as s:
            row = s.scalars(select(CallbackOutbox).where(CallbackOutbox.version_id == version_id)).first()
            return _delivery_record(row) if row is not None else None

    def due_callbacks(
        self, now: float | None = None, limit: int = 100, offset: int = 0
    ) -> list[CallbackDelivery]:
        """Pending deliveries whose next attempt is due, earliest first (also what survives a restart)."""
        now = time.time() if now is None else now
        with self._read() as s:
            rows = s.scalars(
                select(CallbackOutbox)
                .where(CallbackOutbox.status == "pending", CallbackOutbox.next_attempt_at <= now)
                .order_by(CallbackOutbox.next_attempt_at, CallbackOutbox.created_at)
                .limit(limit)
                .offset(offset)
            ).all()
            return [_delivery_record(r) for r in rows]

    def claim_callbacks(
        self, delivery_ids: list[str], lease_until: float, *, now: float | None = None
    ) -> list[CallbackDelivery]:
        """Take the given deliveries for one attempt each: those still pending and due move their next
        attempt to ``lease_until`` and are returned, in one transaction. Another process (or a later
        look) does not take them while the attempt runs; if this process dies during it, the
        delivery is due again once the lease ends."""
        if not delivery_ids:
            return []
        now = time.time() if now is None else now
        with self._write() as s:
            rows = s.scalars(
                select(CallbackOutbox)
                .where(
                    CallbackOutbox.delivery_id.in_(delivery_ids),
                    CallbackOutbox.status == "pending",
                    CallbackOutbox.next_attempt_at <= now,
                )
                .with_for_update(skip_locked=True)
            ).all()
            for row in rows:
                row.next_attempt_at = lease_until
            return [_delivery_record(r) for r in rows]

    def callback_backlog(self) -> int:
        """Deliveries still pending (due now or waiting for their next attempt)."""
        with self._read() as s:
            return int(
                s.scalar(
                    select(func.count()).select_from(CallbackOutbox).where(CallbackOutbox.status == "pending")
                )
                or 0
            )

    def record_attempt(
        self,
        delivery_id: str,
        ok: bool,
        error: str | None = None,
        next_attempt_at: float | None = None,
        *,
        now: float | None = None,
    ) -> CallbackDelivery:
        """Count one delivery attempt. ``ok`` -> delivered. Failed with ``next_attempt_at`` -> stays
        pending until then; failed without it -> gave_up (the caller applies callback_max_attempts)."""
        now = time.time() if now is None else now
        with self._write() as s:
            row = s.get(CallbackOutbox, delivery_id, with_for_update=True)
            if row is None:
                raise KeyError(delivery_id)
            row.attempts += 1
            if ok:
                row.status, row.delivered_at, row.next_attempt_at, row.last_error = (
                    "delivered",
                    now,
                    None,
                    None,
                )
            elif next_attempt_at is not None:
                row.status, row.next_attempt_at, row.last_error = "pending", next_attempt_at, error
            else:
                row.status, row.next_attempt_at, row.last_error = "gave_up", None, error
            record = _delivery_record(row)
        self.events.delivery_attempted(record)
        return record
