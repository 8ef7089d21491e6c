"""changes: a change counter per job version and one for the queues, bumped in the transaction of
every write a cached view shows, so API processes sharing the store never serve each other's stale
views (api.store.changes). Every existing job gets its row (counter 1) and the queues theirs.

Revision ID: 0005_change_counters
Revises: 0004_job_priority
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_change_counters"
down_revision = "0004_job_priority"
branch_labels = None
depends_on = None


def upgrade() -> None:
    changes = op.create_table(
        "changes",
        sa.Column("subject", sa.String(length=32), nullable=False),
        sa.Column("counter", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("subject"),
    )
    jobs = sa.table("jobs", sa.column("version_id", sa.String(32)))
    every_job = sa.select(jobs.c.version_id, sa.literal_column("1"))
    op.execute(changes.insert().from_select(["subject", "counter"], every_job))
    op.bulk_insert(changes, [{"subject": ":queue", "counter": 1}])


def downgrade() -> None:
    op.drop_table("changes")
