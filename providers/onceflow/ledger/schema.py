"""The ledger's tables: the one definition of the schema (columns, keys, indexes, guards).

A new ledger is created from this module (``metadata.create_all`` plus the guards below) and
stamped with the newest Alembic revision; an existing one is brought here by the revisions in
``migrations/versions/``, which are deltas only. ``tests/integration/test_ledger_migrations.py``
checks that both roads end in the same database. Times are float seconds since the epoch
(UTC); JSON values are stored as text.

The database enforces the state model, not only the Python code: ``state`` columns accept only
the states of :mod:`onceflow.ledger.states` and ``transitions.event`` only its events (CHECK
constraints); a leased item has an owner and an expiry, ``1 <= max_attempts >= attempts``; and
triggers (``sql/guards.sql``) refuse an item created other than pending, a move along a pair the
state table does not allow, ``done`` without a result, a fencing token that changes other than
by + 1 into a new lease (or a new lease without one), and any UPDATE or DELETE of
``transitions`` (append-only). ``docs/ledger.md`` lists the plain-SQL writes refused.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from onceflow.ledger import states
from onceflow.ledger.queries import query

metadata = sa.MetaData()

Time = sa.Double


def _one_of(column: str, values: frozenset[str], *, nullable: bool = False) -> str:
    listed = ", ".join(f"'{v}'" for v in sorted(values))
    check = f"{column} IN ({listed})"
    return f"{column} IS NULL OR {check}" if nullable else check


# (constraint name, table, SQL): Alembic revisions add these by name, so they are written once.
CHECKS: dict[str, tuple[str, str]] = {
    "ck_work_items_state": ("work_items", _one_of("state", states.STATES)),
    "ck_work_items_fencing_token": ("work_items", "fencing_token >= 0"),
    "ck_work_items_attempts": ("work_items", "attempts >= 0 AND max_attempts >= 0"),
    "ck_transitions_from_state": ("transitions", _one_of("from_state", states.STATES, nullable=True)),
    "ck_transitions_to_state": ("transitions", _one_of("to_state", states.STATES, nullable=True)),
    # ledger_v6: the state machine's per-state column rules and the known events
    "ck_work_items_attempt_budget": ("work_items", "max_attempts >= 1 AND attempts <= max_attempts"),
    "ck_work_items_leased_has_lease": (
        "work_items",
        "state <> 'leased' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
    ),
    "ck_transitions_event": ("transitions", _one_of("event", frozenset(states.BY_EVENT))),
}


def _checks(table: str) -> list[sa.CheckConstraint]:
    return [sa.CheckConstraint(sql, name=name) for name, (t, sql) in CHECKS.items() if t == table]


work_items = sa.Table(
    "work_items",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("work_key", sa.String(512), nullable=False, unique=True),
    sa.Column("kind", sa.String(128), nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("available_at", Time, nullable=False),
    sa.Column("lease_owner", sa.String(256)),
    sa.Column("lease_expires_at", Time),
    sa.Column("fencing_token", sa.Integer, nullable=False, default=0),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("max_attempts", sa.Integer, nullable=False, default=5),
    sa.Column("last_error_class", sa.String(256)),
    sa.Column("last_error", sa.Text),
    sa.Column("reason", sa.Text),
    sa.Column("payload", sa.Text),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("updated_at", Time, nullable=False),
    sa.Column("required_version", sa.String(64)),
    sa.Column("lane", sa.String(32), nullable=False, server_default="new"),
    sa.Column("recheck_id", sa.Integer),
    *_checks("work_items"),
)

# Partial and in claim order: a claim walks only live items, best first, and stops at the first
# one it can lock, instead of sorting every finished item of the kind.
_LIVE = sa.text("state IN ('pending', 'leased')")
claim_index = sa.Index(
    "ix_work_items_claim",
    work_items.c.kind,
    work_items.c.lane,
    work_items.c.priority.desc(),
    work_items.c.available_at,
    work_items.c.id,
    postgresql_where=_LIVE,
    sqlite_where=_LIVE,
)
sa.Index("ix_work_items_recheck", work_items.c.recheck_id)
# The operations view's (onceflow.opsview.questions; revision ledger_v5): every query of it reads
# one time window or the live items, not the history.
_PENDING = sa.text("state = 'pending'")
_ERRORED = sa.text("last_error_class IS NOT NULL")
sa.Index("ix_work_items_kind_created", work_items.c.kind, work_items.c.created_at)
sa.Index("ix_work_items_created", work_items.c.created_at)
sa.Index(
    "ix_work_items_eligible",
    work_items.c.kind,
    work_items.c.lane,
    work_items.c.priority,
    work_items.c.required_version,
    work_items.c.available_at,
    work_items.c.created_at,
    postgresql_where=_PENDING,
    sqlite_where=_PENDING,
)
sa.Index("ix_work_items_errors", work_items.c.updated_at, postgresql_where=_ERRORED, sqlite_where=_ERRORED)
# ledger_v7: question 6's leased items per version (the pending ones come from ix_work_items_eligible)
_LEASED = sa.text("state = 'leased'")
sa.Index(
    "ix_work_items_leased",
    work_items.c.kind,
    work_items.c.required_version,
    postgresql_where=_LEASED,
    sqlite_where=_LEASED,
)

transitions = sa.Table(
    "transitions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("work_key", sa.String(512), nullable=False, index=True),
    sa.Column("event", sa.String(64), nullable=False),
    sa.Column("from_state", sa.String(32)),
    sa.Column("to_state", sa.String(32)),
    sa.Column("actor", sa.String(32), nullable=False),
    sa.Column("owner", sa.String(256)),
    sa.Column("fencing_token", sa.Integer),
    sa.Column("at", Time, nullable=False),
    sa.Column("reason", sa.Text),
    *_checks("transitions"),
    sa.Index("ix_transitions_to_state_at", "to_state", "at"),
    sa.Index("ix_transitions_event_at", "event", "at"),
)

results = sa.Table(
    "results",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("work_key", sa.String(512), nullable=False),
    sa.Column("step", sa.String(128), nullable=False),
    sa.Column("processing_version", sa.String(64), nullable=False),
    sa.Column("fencing_token", sa.Integer, nullable=False),
    sa.Column("payload", sa.Text),
    sa.Column("committed_by", sa.String(256)),
    sa.Column("committed_at", Time, nullable=False),
    # The follow-ups this result promised (JSON list of outbox dedup keys / work keys).
    sa.Column("follow_ups", sa.Text),
    sa.UniqueConstraint("work_key", "step", "processing_version", name="uq_results_key_step_version"),
    sa.Index("ix_results_step_committed", "step", "committed_at"),
    sa.Index("ix_results_committed", "committed_at"),
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedup_key", sa.String(512), nullable=False, unique=True),
    sa.Column("work_key", sa.String(512), nullable=False),
    sa.Column("step", sa.String(128), nullable=False),
    sa.Column("target_type", sa.String(32), nullable=False),
    sa.Column("target", sa.String(512), nullable=False),
    sa.Column("payload", sa.Text),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", Time, nullable=False),
    sa.Column("relayed_at", Time),
    sa.Index("ix_outbox_pending", "state", "created_at"),
)

relay_status = sa.Table(
    "relay_status",
    metadata,
    sa.Column("relay_name", sa.String(128), primary_key=True),
    sa.Column("last_run_at", Time, nullable=False),
    sa.Column("last_relayed", sa.Integer, nullable=False),
)

rechecks = sa.Table(
    "rechecks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("scope", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("kind", sa.String(128), nullable=False),
    sa.Column("target_version", sa.String(64)),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("max_items", sa.Integer, nullable=False),
    sa.Column("selected", sa.Integer, nullable=False),
    sa.Column("requested_by", sa.String(256)),
    sa.Column("created_at", Time, nullable=False),
)

# Named DDL in sql/guards.sql, per dialect, run in this order after the tables exist.
GUARDS: dict[str, tuple[str, ...]] = {
    "postgresql": (
        "guard_fencing_token_function_postgresql",
        "guard_fencing_token_trigger_postgresql",
        "guard_state_machine_function_postgresql",
        "guard_state_machine_trigger_postgresql",
        "guard_transitions_append_only_function_postgresql",
        "guard_transitions_append_only_trigger_postgresql",
        "guard_transitions_no_truncate_trigger_postgresql",
    ),
    "sqlite": (
        "guard_fencing_token_trigger_sqlite",
        "guard_state_machine_insert_trigger_sqlite",
        "guard_state_machine_pairs_trigger_sqlite",
        "guard_state_machine_done_trigger_sqlite",
        "guard_state_machine_token_trigger_sqlite",
        "guard_transitions_no_update_trigger_sqlite",
        "guard_transitions_no_delete_trigger_sqlite",
    ),
}


def create_guards(conn: sa.Connection) -> None:
    """Create the triggers of :data:`GUARDS` for ``conn``'s dialect."""
    for name in GUARDS.get(conn.dialect.name, ()):
        conn.execute(query(name))


def drop_guards(conn: sa.Connection) -> None:
    """Drop them again (the downgrade of the revision that added them)."""
    for name in reversed(GUARDS.get(conn.dialect.name, ())):
        conn.execute(query(name.replace("guard_", "drop_guard_", 1)))


@sa.event.listens_for(metadata, "after_create")
def _guards_after_create(_target: sa.MetaData, connection: sa.Connection, **_kw: Any) -> None:
    # after every table: the guards of transitions and of results' use need those tables too
    create_guards(connection)
