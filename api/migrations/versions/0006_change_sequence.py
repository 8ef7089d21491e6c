"""changes.seq: the order in which the change counters moved. Every write transaction that bumps a
counter first bumps the sequence (subject ':seq', its counter the latest number) and stamps each row
it changes with it, so a reader learns everything changed since its last look in one indexed query
(api.store.changes), instead of reading one job's counter per request. A deleted job's row now stays
as a tombstone (counter 0), so that its deletion is in the sequence too. Rows from before have no
number: a reader reads such a job's counter the first time it sees the job.

Revision ID: 0006_change_sequence
Revises: 0005_change_counters
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_change_sequence"
down_revision = "0005_change_counters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("changes") as batch:
        batch.add_column(sa.Column("seq", sa.BigInteger(), nullable=True))
        batch.create_index("ix_changes_seq", ["seq"])
    changes = sa.table("changes", sa.column("subject", sa.String(32)), sa.column("counter", sa.BigInteger()))
    op.bulk_insert(changes, [{"subject": ":seq", "counter": 0}])


def downgrade() -> None:
    op.execute("DELETE FROM changes WHERE subject = ':seq' OR counter = 0")
    with op.batch_alter_table("changes") as batch:
        batch.drop_index("ix_changes_seq")
        batch.drop_column("seq")
