# Verbatim copy of providers/onceflow/ledger/migrations.py at commit f3cd951, the last hand-written
# migrations before Alembic. Test data: it builds ledgers exactly as released code did, so the
# Alembic upgrade path is tested against real old databases. Never edit it.
# ruff: noqa
"""Versioned migrations: an existing ledger database upgrades in place.

Each migration is frozen once released: never edit one, append a new one. ``schema_version`` has
one row per applied migration. :func:`migrate` applies the missing ones in one transaction per
migration, serialised between processes (a PostgreSQL advisory lock; SQLite's write lock), so
many workers can call it at start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.ledger.db import is_sqlite, prepare_engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Connection, Engine

# Any constant; identifies the ledger's migration lock among other advisory locks.
_ADVISORY_LOCK_ID = 0x0CEF10


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _add_column(conn: Connection, table: str, column: sa.Column) -> None:
    ddl_type = column.type.compile(dialect=conn.dialect)
    default = ""
    if column.server_default is not None:
        default = f" DEFAULT '{column.server_default.arg}'"  # type: ignore[attr-defined]
    null = "" if column.nullable else " NOT NULL"
    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {ddl_type}{default}{null}")


def _v1(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "work_items",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("work_key", sa.String(512), nullable=False, unique=True),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("available_at", sa.Double, nullable=False),
        sa.Column("lease_owner", sa.String(256)),
        sa.Column("lease_expires_at", sa.Double),
        sa.Column("fencing_token", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("last_error_class", sa.String(256)),
        sa.Column("last_error", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("payload", sa.Text),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Index("ix_work_items_claim_v1", "kind", "state", "available_at"),
    )
    sa.Table(
        "transitions",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("work_key", sa.String(512), nullable=False, index=True),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("from_state", sa.String(32)),
        sa.Column("to_state", sa.String(32)),
        sa.Column("actor", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(256)),
        sa.Column("fencing_token", sa.Integer),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("reason", sa.Text),
    )
    sa.Table(
        "results",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("work_key", sa.String(512), nullable=False),
        sa.Column("step", sa.String(128), nullable=False),
        sa.Column("processing_version", sa.String(64), nullable=False),
        sa.Column("fencing_token", sa.Integer, nullable=False),
        sa.Column("payload", sa.Text),
        sa.Column("committed_by", sa.String(256)),
        sa.Column("committed_at", sa.Double, nullable=False),
        sa.UniqueConstraint("work_key", "step", "processing_version", name="uq_results_key_step_version"),
    )
    md.create_all(conn)


def _v2(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "outbox",
        md,
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
        sa.Index("ix_outbox_pending", "state", "created_at"),
    )
    sa.Table(
        "relay_status",
        md,
        sa.Column("relay_name", sa.String(128), primary_key=True),
        sa.Column("last_run_at", sa.Double, nullable=False),
        sa.Column("last_relayed", sa.Integer, nullable=False),
    )
    md.create_all(conn)
    _add_column(conn, "results", sa.Column("follow_ups", sa.Text))


def _v3(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "rechecks",
        md,
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
    md.create_all(conn)
    _add_column(conn, "work_items", sa.Column("required_version", sa.String(64)))
    _add_column(conn, "work_items", sa.Column("lane", sa.String(32), nullable=False, server_default="new"))
    _add_column(conn, "work_items", sa.Column("recheck_id", sa.Integer))
    conn.exec_driver_sql("DROP INDEX ix_work_items_claim_v1")
    # Partial and in claim order: a claim walks only live items, best first, and stops at the
    # first one it can lock, instead of sorting every finished item of the kind.
    conn.exec_driver_sql(
        "CREATE INDEX ix_work_items_claim ON work_items (kind, lane, priority DESC, available_at, id)"
        " WHERE state IN ('pending', 'leased')"
    )
    conn.exec_driver_sql("CREATE INDEX ix_work_items_recheck ON work_items (recheck_id)")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "work items, transitions, results", _v1),
    Migration(2, "outbox, relay status, promised follow-ups on results", _v2),
    Migration(3, "required processing version, lanes, rechecks", _v3),
)
LATEST_VERSION = MIGRATIONS[-1].version


def _create_version_table(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "schema_version",
        md,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(256), nullable=False),
        sa.Column("applied_at", sa.Double, nullable=False),
    )
    md.create_all(conn, checkfirst=True)


def current_version(engine: Engine) -> int:
    """Highest applied migration, 0 for an empty database."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("schema_version"):
            return 0
        return int(conn.exec_driver_sql("SELECT COALESCE(MAX(version), 0) FROM schema_version").scalar_one())


def migrate(engine: Engine, target: int | None = None) -> list[int]:
    """Apply every missing migration up to ``target`` (default: the newest).

    :param engine: the ledger's engine.
    :param target: stop after this version (tests use it to build an old database).
    :return: the versions applied now (empty when already up to date).
    """
    prepare_engine(engine)
    target = LATEST_VERSION if target is None else target
    applied: list[int] = []
    for migration in MIGRATIONS:
        if migration.version > target:
            break
        with engine.begin() as conn:
            if not is_sqlite(conn):
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _ADVISORY_LOCK_ID})
            _create_version_table(conn)
            done = conn.execute(
                sa.text("SELECT 1 FROM schema_version WHERE version = :v"), {"v": migration.version}
            ).first()
            if done:
                continue
            migration.apply(conn)
            conn.execute(
                sa.text("INSERT INTO schema_version (version, description, applied_at) VALUES (:v, :d, :t)"),
                {"v": migration.version, "d": migration.description, "t": time.time()},
            )
            applied.append(migration.version)
    return applied
