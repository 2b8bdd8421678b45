"""The database enforces the state machine, not only its state names (issue 22, defect 6).

CHECK constraints: a leased item has an owner and an expiry; ``1 <= max_attempts >= attempts``;
``transitions.event`` is an event of the state table. Triggers (``sql/guards.sql``): an item is
created pending with token 0, moves only along a (from, to) pair of the state table, becomes done
only with a result, and its fencing token changes only by + 1 into a new lease (and a new lease
always takes one); ``transitions`` is append-only (no UPDATE, DELETE or, on PostgreSQL, TRUNCATE).

Rows that break a new constraint stop the upgrade with their keys (nothing is changed), as in
ledger_v4. On SQLite adding a constraint rebuilds the table, which drops its triggers and turns
its partial indexes into whole ones: the trigger and the partial indexes (ledger_v4's claim index,
ledger_v5's pending and errored ones) are dropped first and put back as released.

Revision ID: ledger_v6
Revises: ledger_v5
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from onceflow.ledger.errors import LedgerSchemaError
from onceflow.ledger.queries import query

revision = "ledger_v6"
down_revision = "ledger_v5"
branch_labels = None
depends_on = None

_TABLES = ("work_items", "transitions")
_EVENTS = (
    "'abandon', 'cancel', 'claim', 'commit_refused', 'complete', 'correct', 'create', 'expire', "
    "'give_up', 'give_up_expired', 'heartbeat', 'invalid_input', 'recheck', 'reclaim_expired', "
    "'record_result', 'release', 'repair_follow_up', 'retry'"
)
# Frozen copies (see ledger_v4): what this revision adds, whatever schema.py says later.
_ADDED: dict[str, tuple[str, str]] = {
    "ck_work_items_attempt_budget": ("work_items", "max_attempts >= 1 AND attempts <= max_attempts"),
    "ck_work_items_leased_has_lease": (
        "work_items",
        "state <> 'leased' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
    ),
    "ck_transitions_event": ("transitions", f"event IN ({_EVENTS})"),
}
_GUARDS: dict[str, tuple[str, ...]] = {
    "postgresql": (
        "guard_state_machine_function_postgresql",
        "guard_state_machine_trigger_postgresql",
        "guard_transitions_append_only_function_postgresql",
        "guard_transitions_append_only_trigger_postgresql",
        "guard_transitions_no_truncate_trigger_postgresql",
    ),
    "sqlite": (
        "guard_state_machine_insert_trigger_sqlite",
        "guard_state_machine_pairs_trigger_sqlite",
        "guard_state_machine_done_trigger_sqlite",
        "guard_state_machine_token_trigger_sqlite",
        "guard_transitions_no_update_trigger_sqlite",
        "guard_transitions_no_delete_trigger_sqlite",
    ),
}
# ledger_v4's SQLite trigger on work_items, lost with the table rebuild and put back
_V4_SQLITE_TRIGGER = "guard_fencing_token_trigger_sqlite"
_LIVE = "state IN ('pending', 'leased')"
# the partial indexes of work_items as released (ledger_v4, ledger_v5): name -> (columns, where)
_PARTIAL: dict[str, tuple[list[Any], str]] = {
    "ix_work_items_claim": (["kind", "lane", sa.text("priority DESC"), "available_at", "id"], _LIVE),
    "ix_work_items_eligible": (
        ["kind", "lane", "priority", "required_version", "available_at", "created_at"],
        "state = 'pending'",
    ),
    "ix_work_items_errors": (["updated_at"], "last_error_class IS NOT NULL"),
}


def _create_partial_indexes() -> None:
    for name, (columns, where) in _PARTIAL.items():
        op.create_index(
            name, "work_items", columns, postgresql_where=sa.text(where), sqlite_where=sa.text(where)
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
    done = list(
        conn.execute(
            sa.text(
                "SELECT work_key FROM work_items w WHERE state = 'done' AND NOT EXISTS "
                "(SELECT 1 FROM results r WHERE r.work_key = w.work_key) ORDER BY id LIMIT 5"
            )
        ).scalars()
    )
    if done:
        raise LedgerSchemaError(
            f"cannot enforce 'done has its result': work_items {done} are done without a result; "
            "re-open (recheck) or record their results, then run `onceflow ledger upgrade` again"
        )


def _alter(add: bool) -> None:
    conn = op.get_bind()
    sqlite = conn.dialect.name == "sqlite"
    if sqlite:
        conn.execute(query(f"drop_{_V4_SQLITE_TRIGGER}"))
    for name in _PARTIAL:
        op.drop_index(name, "work_items")
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for name, (owner, check) in _ADDED.items():
                if owner != table:
                    continue
                if add:
                    batch.create_check_constraint(name, sa.text(check))
                else:
                    batch.drop_constraint(name, type_="check")
    _create_partial_indexes()
    if sqlite:
        conn.execute(query(_V4_SQLITE_TRIGGER))


def upgrade() -> None:
    conn = op.get_bind()
    _refuse_violations(conn)
    _alter(add=True)
    for name in _GUARDS.get(conn.dialect.name, ()):
        conn.execute(query(name))


def downgrade() -> None:
    conn = op.get_bind()
    for name in reversed(_GUARDS.get(conn.dialect.name, ())):
        conn.execute(query(name.replace("guard_", "drop_guard_", 1)))
    _alter(add=False)
