"""An index of the leased items per kind and required version, for the operations view's question 6
(``onceflow.opsview.questions.active_versions``).

The pending items are read index-only from ``ix_work_items_eligible`` (``ledger_v5``); the leased
ones had no index carrying their version, and PostgreSQL read the whole table for them (100,000
items: 4,666 pages, 20 ms idle and 400 ms under load, growing with the history). Only an index:
nothing is rewritten; on PostgreSQL the build holds writes on ``work_items`` for as long as it
takes (a second on a million items).

Revision ID: ledger_v7
Revises: ledger_v6
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_v7"
down_revision = "ledger_v6"
branch_labels = None
depends_on = None

_LEASED = "state = 'leased'"


def upgrade() -> None:
    op.create_index(
        "ix_work_items_leased",
        "work_items",
        ["kind", "required_version"],
        postgresql_where=sa.text(_LEASED),
        sqlite_where=sa.text(_LEASED),
    )


def downgrade() -> None:
    op.drop_index("ix_work_items_leased", "work_items")
