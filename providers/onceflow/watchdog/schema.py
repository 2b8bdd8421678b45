"""The tables of the dead-man's switch, kept apart from the ledger's Alembic-managed schema.

``onceflow_heartbeats`` is written by the ``heartbeat`` DAG (through
:class:`onceflow.hooks.heartbeat.HeartbeatHook`); the ``watchdog_*`` tables are the watchdog's
incident states, its alert outbox and the first-seen times of queue rows. They live in the ledger
database (connection ``onceflow_ledger``) but are created here with ``CREATE TABLE IF NOT
EXISTS`` rather than by a ledger migration, because the watchdog must start and alert even when
the ledger's migrations have not run (or failed), and it must never need Airflow (where the
migration command lives). The tables share no keys with the ledger's, so the two schemas evolve
independently; a change here must stay additive. Times are float seconds since the epoch (UTC),
as in the ledger.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

metadata = sa.MetaData()

heartbeats = sa.Table(
    "onceflow_heartbeats",
    metadata,
    sa.Column("run_id", sa.String(250), primary_key=True),
    sa.Column("dag_id", sa.String(250), nullable=False),
    sa.Column("scheduled_at", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("lag_seconds", sa.Double, nullable=False),
    sa.Column("try_number", sa.Integer, nullable=False),
    sa.Column("hostname", sa.String(250)),
    sa.Index("ix_onceflow_heartbeats_started", "started_at"),
)

incidents = sa.Table(
    "watchdog_incidents",
    metadata,
    sa.Column("check_name", sa.String(200), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    # Compare-and-set guard: every transition moves it by one.
    sa.Column("version", sa.Integer, nullable=False),
    # Incident counter: bumped when the check goes down, names the incident in alert keys.
    sa.Column("incident", sa.Integer, nullable=False),
    sa.Column("since", sa.Double, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("updated_by", sa.String(250)),
    sa.Column("alerted", sa.Boolean, nullable=False),
    sa.Column("last_alert_at", sa.Double),
    sa.Column("reminders", sa.Integer, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("evidence", sa.Text),
)

alerts = sa.Table(
    "watchdog_alerts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # <check>/<incident>/<kind>[/<n>]/<channel>: one row per message, whoever enqueues it.
    sa.Column("dedup_key", sa.String(400), nullable=False, unique=True),
    sa.Column("check_name", sa.String(200), nullable=False),
    sa.Column("incident", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("channel", sa.String(16), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    # queued -> sent; "superseded" when its check recovered before it went out (one message said
    # both); "suppressed" for a silenced check (kept so the silence is on record).
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.Double, nullable=False),
    sa.Column("lease_owner", sa.String(250)),
    sa.Column("lease_until", sa.Double),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("sent_at", sa.Double),
    sa.Index("ix_watchdog_alerts_state", "state", "next_attempt_at"),
)

flips = sa.Table(
    "watchdog_flips",
    metadata,
    # Every state change of every check, for flap damping and the status API's "last N flips".
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("check_name", sa.String(200), nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("from_state", sa.String(16), nullable=False),
    sa.Column("to_state", sa.String(16), nullable=False),
    sa.Column("incident", sa.Integer, nullable=False),
    sa.Column("actor", sa.String(250)),
    sa.Index("ix_watchdog_flips_check_at", "check_name", "at"),
)

local_meta = sa.Table(
    "watchdog_local_meta",
    metadata,
    # Only in a replica's own state file: its random id, which scopes its blindness alert keys.
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(200), nullable=False),
)

seen = sa.Table(
    "watchdog_seen",
    metadata,
    sa.Column("check_name", sa.String(200), primary_key=True),
    sa.Column("item_key", sa.String(600), primary_key=True),
    sa.Column("first_seen", sa.Double, nullable=False),
)


def ensure_schema(engine: Engine, tables: list[sa.Table] | None = None) -> None:
    """Create the tables if missing; safe when several processes start at once.

    Two PostgreSQL sessions both running ``CREATE TABLE IF NOT EXISTS`` can still collide on
    the catalog's unique index; the loser retries and then finds the tables.
    """
    for attempt in range(3):
        try:
            metadata.create_all(engine, tables=tables, checkfirst=True)
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError) as exc:
            if attempt == 2:
                raise
            log.info("schema created concurrently by another process (%s); checking again", exc.orig)
