"""Baseline: the service store as the release before migrations created it (Base.metadata.create_all).

Written out table by table on purpose: the models change later, this revision must not.

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "input_assets",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("media_type", sa.String(length=128), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    op.create_table(
        "jobs",
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("work_id", sa.String(length=255), nullable=False),
        sa.Column("shot_id", sa.String(length=255), nullable=True),
        sa.Column("job_id", sa.String(length=255), nullable=True),
        sa.Column("payload_hash", sa.String(length=64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("callback_context", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("root_run_id", sa.String(length=64), nullable=True),
        sa.Column("submitted_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("live", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("version_id"),
    )
    op.create_index("ix_jobs_kind_status_created", "jobs", ["kind", "status", "created_at"])
    op.create_index("ix_jobs_shot", "jobs", ["work_id", "shot_id", "status"])
    op.create_index("ix_jobs_run_id", "jobs", ["run_id"])
    op.create_index("ix_jobs_submitted", "jobs", ["submitted_at"])
    op.create_table(
        "artifacts",
        sa.Column("artifact_id", sa.String(length=32), nullable=False),
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("work_id", sa.String(length=255), nullable=False),
        sa.Column("shot_id", sa.String(length=255), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("url_path", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("artifact_id"),
        sa.UniqueConstraint("version_id", "path", name="uq_artifacts_version_path"),
        sa.ForeignKeyConstraint(["version_id"], ["jobs.version_id"]),
    )
    op.create_index("ix_artifacts_version_id", "artifacts", ["version_id"])
    op.create_table(
        "callback_outbox",
        sa.Column("delivery_id", sa.String(length=32), nullable=False),
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("delivery_id"),
        sa.UniqueConstraint("version_id"),
        sa.ForeignKeyConstraint(["version_id"], ["jobs.version_id"]),
    )
    op.create_index("ix_outbox_due", "callback_outbox", ["status", "next_attempt_at"])
    op.create_table(
        "idempotency_keys",
        sa.Column("job_id", sa.String(length=255), nullable=False),
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("payload_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
        sa.ForeignKeyConstraint(["version_id"], ["jobs.version_id"]),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_index("ix_outbox_due", table_name="callback_outbox")
    op.drop_table("callback_outbox")
    op.drop_index("ix_artifacts_version_id", table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_index("ix_jobs_submitted", table_name="jobs")
    op.drop_index("ix_jobs_run_id", table_name="jobs")
    op.drop_index("ix_jobs_shot", table_name="jobs")
    op.drop_index("ix_jobs_kind_status_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("input_assets")
