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

from onceflow.ledger.errors import LedgerSchemaError
from onceflow.ledger.queries import query

revision = "ledger_v4"
down_revision = "ledger_v3"
branch_labels = None
depends_on = None

_TABLES = ("work_items", "transitions")
_STATES = "'cancelled', 'done', 'failed', 'leased', 'needs_correction', 'pending'"
# A frozen copy of schema.CHECKS as this revision adds them (name: table, SQL). Not the live
# dict: once a later release changes a check, this revision must still create the constraint it
# created when it was released, or the revision that changes it finds something else.
_ADDED: dict[str, tuple[str, str]] = {
    "ck_work_items_state": ("work_items", f"state IN ({_STATES})"),
    "ck_work_items_fencing_token": ("work_items", "fencing_token >= 0"),
    "ck_work_items_attempts": ("work_items", "attempts >= 0 AND max_attempts >= 0"),
    "ck_transitions_from_state": ("transitions", f"from_state IS NULL OR from_state IN ({_STATES})"),
    "ck_transitions_to_state": ("transitions", f"to_state IS NULL OR to_state IN ({_STATES})"),
}
# The triggers this revision adds: named statements of sql/guards.sql, which are never edited
# once released (a changed guard is a new statement and a new revision), listed here, not taken
# from schema.GUARDS.
_GUARDS: dict[str, tuple[str, ...]] = {
    "postgresql": ("guard_fencing_token_function_postgresql", "guard_fencing_token_trigger_postgresql"),
    "sqlite": ("guard_fencing_token_trigger_sqlite",),
}
# The claim index as released (SQLite's table rebuild drops it; it is put back with this shape).
_LIVE = "state IN ('pending', 'leased')"


def _create_claim_index() -> None:
    op.create_index(
        "ix_work_items_claim",
        "work_items",
        ["kind", "lane", sa.text("priority DESC"), "available_at", "id"],
        postgresql_where=sa.text(_LIVE),
        sqlite_where=sa.text(_LIVE),
    )


def _refuse_violations(conn: sa.Connection) -> None:
    for name, (table, check) in _ADDED.items():
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
            for name, (owner, check) in _ADDED.items():
                if owner == table:
                    batch.create_check_constraint(name, sa.text(check))
    _create_claim_index()
    for name in _GUARDS.get(conn.dialect.name, ()):
        conn.execute(query(name))
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
    for name in reversed(_GUARDS.get(conn.dialect.name, ())):
        conn.execute(query(name.replace("guard_", "drop_guard_", 1)))
    op.drop_index("ix_work_items_claim", "work_items")
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for name, (owner, _check) in _ADDED.items():
                if owner == table:
                    batch.drop_constraint(name, type_="check")
    _create_claim_index()
