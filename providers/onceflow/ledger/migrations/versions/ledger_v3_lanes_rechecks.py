"""Required processing version, lanes, rechecks (the hand-written migration 3).

Revision ID: ledger_v3
Revises: ledger_v2
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_v3"
down_revision = "ledger_v2"
branch_labels = None
depends_on = None

_LIVE = sa.text("state IN ('pending', 'leased')")


def upgrade() -> None:
    op.create_table(
        "rechecks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("target_version", sa.String(64)),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("max_items", sa.Integer, nullable=False),
        sa.Column("selected", sa.Integer, nullable=False),
        sa.Column("requested_by", sa.String(256)),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    op.add_column("work_items", sa.Column("required_version", sa.String(64)))
    op.add_column("work_items", sa.Column("lane", sa.String(32), nullable=False, server_default="new"))
    op.add_column("work_items", sa.Column("recheck_id", sa.Integer))
    op.drop_index("ix_work_items_claim_v1", "work_items")
    op.create_index(
        "ix_work_items_claim",
        "work_items",
        ["kind", "lane", sa.text("priority DESC"), "available_at", "id"],
        postgresql_where=_LIVE,
        sqlite_where=_LIVE,
    )
    op.create_index("ix_work_items_recheck", "work_items", ["recheck_id"])


def downgrade() -> None:
    op.drop_index("ix_work_items_recheck", "work_items")
    op.drop_index("ix_work_items_claim", "work_items")
    op.create_index("ix_work_items_claim_v1", "work_items", ["kind", "state", "available_at"])
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("recheck_id")
        batch.drop_column("lane")
        batch.drop_column("required_version")
    op.drop_table("rechecks")
