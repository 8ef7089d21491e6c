"""Callbacks: the one POST a finished job's ``callback_url`` gets, through the store's durable outbox
(queued in the same process that records the outcome, delivered with exponential backoff).

Deliveries run concurrently on one asyncio loop of their own: each attempt is bounded as a whole
(``callback_timeout_seconds``, however slowly a receiver answers), at most
``callback_concurrency`` are in flight and at most ``callback_concurrency_per_host`` to one receiver
host, so a receiver that hangs costs its own slots and never delays another job's callback or the
API. An attempt is taken with a lease in the store (``claim_callbacks``): two API processes never
send the same attempt, and one that dies mid-attempt leaves it due again when the lease ends."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from urllib.parse import urlsplit

import httpx

from api.core.outcome import callback_payload
from api.core.records import JobRecord
from api.store import CallbackDelivery, Store, StoreUnavailable, backoff_delay
from settings.api import ApiConfig

log = logging.getLogger("shotloom.api")
DELIVERY_HEADER = "X-Shotloom-Delivery-Id"
SECRET_HEADER = "X-Nanobot-Director-Secret"  # the shared secret (api.callback_secret_env), when set
IDLE_S = 0.5  # between looks at the outbox
LEASE_MARGIN_S = 30.0  # a claimed attempt stays ours this long past its timeout (recording it included)
DUE_PAGE = 100  # due deliveries read per page; pages are read until the free slots are filled...
DUE_PAGES = 10  # ...or this many were read (a hung receiver's backlog cannot hide the others' for long)
RECORD_RETRY_S = 1.0  # an outcome the store could not take (database away) is recorded again after this


def under(url: str, prefix: str) -> bool:
    """``url`` is ``prefix``'s scheme, host and port, its path at or below the prefix's."""
    a, b = urlsplit(url), urlsplit(prefix)
    if (a.scheme.lower(), a.netloc.lower()) != (b.scheme.lower(), b.netloc.lower()):
        return False
    base = b.path if b.path.endswith("/") else b.path + "/"
    return a.path == b.path or a.path.startswith(base)


def receiver_host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


class Callbacks:
    def __init__(self, store: Store, api: ApiConfig, stopping: threading.Event):
        self.store = store
        self.api = api
        self.stopping = stopping
        self.delivered = 0
        secret = os.environ.get(api.callback_secret_env, "").strip()  # read once: at start
        self.secret = {SECRET_HEADER: secret} if secret else {}
        if secret and not api.callback_secret_urls:
            log.warning(
                "%s is set but api.callback_secret_urls is empty: no callback carries it",
                api.callback_secret_env,
            )
        self._flights: dict[str, str] = {}  # delivery id -> receiver host, while its attempt runs
        # (read and written on the delivery loop only; the store calls get a copy)

    def payload(self, job: JobRecord) -> dict:
        """The callback ``job`` gets for its outcome: what ``Store.update_status(callback=...)``
        queues with the change that finishes it."""
        return callback_payload(job, self.store, self.api)

    def headers_for(self, url: str) -> dict[str, str]:
        """The secret, for a receiver under one of ``callback_secret_urls`` only."""
        if self.secret and any(under(url, prefix) for prefix in self.api.callback_secret_urls):
            return self.secret
        return {}

    def loop(self) -> None:
        asyncio.run(self._deliver_until_stopped())

    async def _deliver_until_stopped(self) -> None:
        slots = self.api.callback_concurrency
        limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=self.api.callback_timeout_seconds, limits=limits) as client:
            while not self.stopping.is_set():
                try:
                    for delivery in await asyncio.to_thread(self._claim_due, dict(self._flights)):
                        self._flights[delivery.delivery_id] = receiver_host(delivery.url)
                        task = asyncio.create_task(self._attempt(client, delivery))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                except StoreUnavailable:
                    pass  # said once a while by the store itself; the next look
                except Exception as exc:  # the store locked, a bug: the next look
                    log.warning("callbacks: %s", exc)
                await asyncio.sleep(IDLE_S)
            # Stopping: attempts still running are dropped; their leases end and they are sent again.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _claim_due(self, flights: dict[str, str]) -> list[CallbackDelivery]:
        """Claim the due deliveries that fit the free slots (overall and per receiver host) beside
        the attempts in ``flights`` (id -> host)."""
        free = self.api.callback_concurrency - len(flights)
        busy = collections.Counter(flights.values())
        chosen: list[str] = []
        for page in range(DUE_PAGES):
            if free <= len(chosen):
                break
            due = self.store.due_callbacks(limit=DUE_PAGE, offset=page * DUE_PAGE)
            for d in due:
                host = receiver_host(d.url)
                if d.delivery_id in flights or busy[host] >= self.api.callback_concurrency_per_host:
                    continue
                busy[host] += 1
                chosen.append(d.delivery_id)
                if len(chosen) == free:
                    break
            if len(due) < DUE_PAGE:
                break
        lease_until = time.time() + self.api.callback_timeout_seconds + LEASE_MARGIN_S
        return self.store.claim_callbacks(chosen, lease_until)

    async def _attempt(self, client: httpx.AsyncClient, d: CallbackDelivery) -> None:
        timeout = self.api.callback_timeout_seconds
        try:
            try:
                async with asyncio.timeout(timeout):
                    headers = {DELIVERY_HEADER: d.delivery_id, **self.headers_for(d.url)}
                    resp = await client.post(d.url, json=d.payload, headers=headers)
                ok, error = resp.is_success, f"HTTP {resp.status_code}"
            except TimeoutError:
                ok, error = False, f"no answer within callback_timeout_seconds ({timeout:g} s)"
            except httpx.HTTPError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            # The outcome must reach the store (else the attempt is made again when its lease
            # ends): a database away for a while is waited for, the slot held meanwhile.
            while True:
                try:
                    await asyncio.to_thread(self._record, d, ok, error)
                    return
                except Exception as exc:
                    if self.stopping.is_set():
                        raise
                    log.warning("callback %s: recording the attempt failed, retrying: %s", d.delivery_id, exc)
                    await asyncio.sleep(RECORD_RETRY_S)
        finally:
            self._flights.pop(d.delivery_id, None)

    def _record(self, d: CallbackDelivery, ok: bool, error: str) -> None:
        attempts = d.attempts + 1
        limit = self.api.callback_max_attempts
        if ok:
            self.store.record_attempt(d.delivery_id, True)
            self.delivered += 1
        elif limit and attempts >= limit:
            self.store.record_attempt(d.delivery_id, False, error)
            log.warning(
                "callback %s for %s gave up after %d attempts: %s",
                d.delivery_id,
                d.version_id,
                attempts,
                error,
            )
        else:
            delay = backoff_delay(attempts, self.api.callback_backoff_seconds)
            self.store.record_attempt(d.delivery_id, False, error, time.time() + delay)
