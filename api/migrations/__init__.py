"""Alembic migrations of the service store's schema (``api.store``), run programmatically at start.

No ``alembic.ini``: :func:`alembic_config` builds the :class:`alembic.config.Config` in code, with
``script_location`` at this package and the caller's connection in ``config.attributes["connection"]``
(``env.py`` runs the revisions on it, inside the caller's transaction). ``Store.create_schema`` calls
:func:`is_current` (one cheap read) and, only when behind, :func:`upgrade` under its lock.

A database written before migrations existed (the five tables, no ``alembic_version``) is stamped
:data:`BASELINE` first and then upgraded, so its rows are kept. A new database runs every revision.

New revision (from the repository root, against a scratch database at head)::

    python -c "from api.migrations import alembic_config; from alembic import command; \\
        command.revision(alembic_config(url='sqlite:///var/scratch.sqlite'), 'what changed', \\
        autogenerate=True, rev_id='0003_...')"
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

__all__ = ["BASELINE", "alembic_config", "head", "is_current", "upgrade"]

SCRIPT_LOCATION = Path(__file__).resolve().parent
# The schema as the release before migrations created it (Base.metadata.create_all, no version table).
BASELINE = "0001_baseline"
_BASELINE_TABLES = ("jobs", "idempotency_keys", "artifacts", "input_assets", "callback_outbox")


def alembic_config(connection: Connection | None = None, *, url: str | None = None) -> Config:
    """A Config over this package: runs on ``connection`` (in its transaction) or, without one, on a
    store engine for ``url`` (what the alembic commands use outside the service)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION).replace("%", "%%"))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    """The newest revision (one line of history: exactly one head)."""
    heads = _script().get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"api/migrations must have exactly one head, found {heads}")
    return heads[0]


def current(connection: Connection) -> tuple[str, ...]:
    """The revisions the database is stamped at (empty: no ``alembic_version`` table or no row)."""
    return tuple(MigrationContext.configure(connection).get_current_heads())


def is_current(connection: Connection) -> bool:
    """True when the database is already at :func:`head` (nothing to do)."""
    return current(connection) == (head(),)


def upgrade(connection: Connection) -> bool:
    """Bring the database to :func:`head` on ``connection``, inside its transaction (the caller commits
    and holds whatever lock keeps concurrent starters out). Returns False when it already was."""
    revisions = current(connection)
    if revisions == (head(),):
        return False
    cfg = alembic_config(connection)
    if not revisions:
        present = [t for t in _BASELINE_TABLES if inspect(connection).has_table(t)]
        if present:
            missing = sorted(set(_BASELINE_TABLES) - set(present))
            if missing:
                raise RuntimeError(
                    f"the service store has tables {present} but not {missing} and no alembic_version: "
                    "not a schema this release knows how to upgrade"
                )
            command.stamp(cfg, BASELINE)  # written by the release before migrations: keep its rows
    command.upgrade(cfg, "head")
    return True
