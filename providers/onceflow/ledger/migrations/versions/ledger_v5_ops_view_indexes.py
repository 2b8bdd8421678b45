"""Indexes for the operations view's queries (``onceflow.opsview.questions``): each one bounded by
a time window or the live states, so it reads what it reports and not the whole history.

Only indexes: nothing is rewritten. On PostgreSQL ``CREATE INDEX`` holds writes on the table while
it builds (inside the migration's one transaction, ``CONCURRENTLY`` is not possible): on a ledger
of a million transitions that is seconds; upgrade in a quiet moment. The list is frozen here (not
read from ``schema.py``), as the released revision must keep creating exactly these.

Revision ID: ledger_v5
Revises: ledger_v4
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "ledger_v5"
down_revision = "ledger_v4"
branch_labels = None
depends_on = None

_PENDING = "state = 'pending'"
_ERRORED = "last_error_class IS NOT NULL"
# name: (table, columns, partial-index predicate or None)
INDEXES: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    # question 1: items created per hour and kind; the newest of each kind
    "ix_work_items_kind_created": ("work_items", ("kind", "created_at"), None),
    "ix_work_items_created": ("work_items", ("created_at",), None),
    # question 2: eligible items per kind, lane, priority, version (covering)
    "ix_work_items_eligible": (
        "work_items",
        ("kind", "lane", "priority", "required_version", "available_at", "created_at"),
        _PENDING,
    ),
    # question 4: items that failed an attempt, by when
    "ix_work_items_errors": ("work_items", ("updated_at",), _ERRORED),
    # question 1 (completions) and 3 (expiries): transitions by target state / event and time
    "ix_transitions_to_state_at": ("transitions", ("to_state", "at"), None),
    "ix_transitions_event_at": ("transitions", ("event", "at"), None),
    # question 5 and the article list: results of a step by time; question 6: results by time
    "ix_results_step_committed": ("results", ("step", "committed_at"), None),
    "ix_results_committed": ("results", ("committed_at",), None),
}


def upgrade() -> None:
    for name, (table, columns, where) in INDEXES.items():
        if where is None:
            op.create_index(name, table, list(columns))
        else:
            op.create_index(
                name, table, list(columns), postgresql_where=sa.text(where), sqlite_where=sa.text(where)
            )


def downgrade() -> None:
    for name, (table, _columns, _where) in reversed(INDEXES.items()):
        op.drop_index(name, table)
