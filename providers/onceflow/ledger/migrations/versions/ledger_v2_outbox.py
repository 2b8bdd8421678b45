"""Outbox, relay status, promised follow-ups on results (the hand-written migration 2).

Revision ID: ledger_v2
Revises: ledger_v1
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_v2"
down_revision = "ledger_v1"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dedup_key", sa.String(512), nullable=False, unique=True),
        sa.Column("work_key", sa.String(512), nullable=False),
        sa.Column("step", sa.String(128), nullable=False),
        sa.Column("target_type", sa.String(32), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("payload", sa.Text),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("relayed_at", sa.Double),
    )
    op.create_index("ix_outbox_pending", "outbox", ["state", "created_at"])
    op.create_table(
        "relay_status",
        sa.Column("relay_name", sa.String(128), primary_key=True),
        sa.Column("last_run_at", sa.Double, nullable=False),
        sa.Column("last_relayed", sa.Integer, nullable=False),
    )
    op.add_column("results", sa.Column("follow_ups", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("follow_ups")
    op.drop_table("relay_status")
    op.drop_index("ix_outbox_pending", "outbox")
    op.drop_table("outbox")
