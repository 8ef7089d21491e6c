"""jobs: dialect (which HTTP dialect created the job), submitter (the API key's name), cancel_requested_at.

Existing rows become r2v jobs with no submitter. batch_alter_table: on SQLite these are plain
ALTER TABLE ADD COLUMN / CREATE INDEX (no table copy); elsewhere ordinary ALTERs.

Revision ID: 0002_v1_jobs
Revises: 0001_baseline
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_v1_jobs"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("dialect", sa.String(length=16), server_default="r2v", nullable=False))
        batch.add_column(sa.Column("submitter", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("cancel_requested_at", sa.Float(), nullable=True))
        batch.create_index("ix_jobs_dialect_created", ["dialect", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_dialect_created")
        batch.drop_column("cancel_requested_at")
        batch.drop_column("submitter")
        batch.drop_column("dialect")
