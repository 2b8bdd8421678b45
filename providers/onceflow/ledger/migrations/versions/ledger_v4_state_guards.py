"""The database enforces the state model: CHECK constraints on states and fencing tokens, a
trigger that refuses a fencing token going down.

The hand-written ``schema_version`` table stays, marked complete (versions 1 to 3): workers of
the last hand-written release read it at start-up, and during a rolling deployment they must
find nothing to do rather than re-run their migrations over the new schema.

Rows that break a new constraint stop the upgrade with their keys (nothing is changed): a
ledger holding them has a bug to look at, not data to coerce.

Revision ID: ledger_v4
Revises: ledger_v3
Create Date: 2026-12-01
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

from onceflow.ledger import schema
from onceflow.ledger.errors import LedgerSchemaError

revision = "ledger_v4"
down_revision = "ledger_v3"
branch_labels = None
depends_on = None

_TABLES = ("work_items", "transitions")
# By name, so a later revision that changes one of them finds it where this one left it.
_ADDED = (
    "ck_work_items_state",
    "ck_work_items_fencing_token",
    "ck_work_items_attempts",
    "ck_transitions_from_state",
    "ck_transitions_to_state",
)


def _refuse_violations(conn: sa.Connection) -> None:
    for name in _ADDED:
        table, check = schema.CHECKS[name]
        found = list(
            conn.execute(
                sa.text(f"SELECT work_key FROM {table} WHERE NOT ({check}) ORDER BY id LIMIT 5")
            ).scalars()
        )
        if found:
            raise LedgerSchemaError(
                f"cannot add {name} ({check}): {table} rows of {found} break it; fix or remove "
                "them, then run `onceflow ledger upgrade` again"
            )


def upgrade() -> None:
    conn = op.get_bind()
    _refuse_violations(conn)
    # SQLite rebuilds the table to add a constraint; the partial index is put back by name.
    op.drop_index("ix_work_items_claim", "work_items")
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for name in _ADDED:
                owner, check = schema.CHECKS[name]
                if owner == table:
                    batch.create_check_constraint(name, sa.text(check))
    schema.claim_index.create(conn)
    schema.create_guards(conn)
    _mark_handwritten_current(conn)


# The descriptions the hand-written migrations recorded.
_HANDWRITTEN = (
    (1, "work items, transitions, results"),
    (2, "outbox, relay status, promised follow-ups on results"),
    (3, "required processing version, lanes, rechecks"),
)


def _mark_handwritten_current(conn: sa.Connection) -> None:
    if not sa.inspect(conn).has_table("schema_version"):
        return  # a ledger Alembic created: no hand-written release ever used it
    done = set(conn.execute(sa.text("SELECT version FROM schema_version")).scalars())
    for version, description in _HANDWRITTEN:
        if version not in done:
            conn.execute(
                sa.text("INSERT INTO schema_version (version, description, applied_at) VALUES (:v, :d, :t)"),
                {"v": version, "d": description, "t": time.time()},
            )


def downgrade() -> None:
    conn = op.get_bind()
    schema.drop_guards(conn)
    op.drop_index("ix_work_items_claim", "work_items")
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for name in _ADDED:
                if schema.CHECKS[name][0] == table:
                    batch.drop_constraint(name, type_="check")
    schema.claim_index.create(conn)
