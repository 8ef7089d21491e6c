"""characters: named references (a frame and an audio track taken once from a video), usable as
memory slots in both dialects; their files are rows of input_assets.

Revision ID: 0003_characters
Revises: 0002_v1_jobs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_characters"
down_revision = "0002_v1_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "characters",
        sa.Column("character_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("image_sha256", sa.String(length=64), nullable=False),
        sa.Column("audio_sha256", sa.String(length=64), nullable=True),
        sa.Column("source", sa.JSON(), nullable=False),
        sa.Column("submitter", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["image_sha256"], ["input_assets.sha256"]),
        sa.ForeignKeyConstraint(["audio_sha256"], ["input_assets.sha256"]),
        sa.PrimaryKeyConstraint("character_id"),
    )


def downgrade() -> None:
    op.drop_table("characters")
