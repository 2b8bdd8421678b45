"""Baseline: the hand-written migration 1 (work items, transitions, results).

Nothing runs here. A new ledger is created from ``onceflow.ledger.schema`` and stamped with
the newest revision; a ledger made by the hand-written migrations (table ``schema_version``,
versions 1 to 3) is stamped with ``ledger_v<N>`` and upgraded from there.

Revision ID: ledger_v1
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

revision = "ledger_v1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
