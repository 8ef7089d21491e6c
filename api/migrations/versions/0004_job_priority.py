"""jobs.priority: operators reorder queued jobs (higher first, FIFO among equals); existing jobs 0.

Revision ID: 0004_job_priority
Revises: 0003_characters
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_job_priority"
down_revision = "0003_characters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("priority")
