"""Engine set-up shared by every ledger module: SQLite serialisation and row locks.

SQLite has one writer at a time. Every ledger transaction on SQLite starts with
``BEGIN IMMEDIATE`` so it takes the write lock up front: two claimers can never both read an
item as pending and then race to upgrade their read locks (which SQLite answers with
``SQLITE_BUSY`` instead of waiting). PostgreSQL keeps its default READ COMMITTED isolation; the
claim uses ``FOR UPDATE SKIP LOCKED`` and every other write locks its row with ``FOR UPDATE``.
"""

from __future__ import annotations

import random
import sqlite3
import time
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import StaticPool

from onceflow.extras import require

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

_PREPARED_FLAG = "_onceflow_ledger_prepared"
SQLITE_BUSY_TIMEOUT_MS = 60_000


def create_ledger_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for a ledger URL, prepared for the ledger's transaction rules.

    :param url: SQLAlchemy URL, e.g. ``postgresql+psycopg2://host/db`` or ``sqlite:////path/ledger.db``.
    :param kwargs: passed to :func:`sqlalchemy.create_engine`.
    """
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg2":
        require("postgres")
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        # One shared connection, otherwise every pooled connection sees its own empty database.
        kwargs.setdefault("poolclass", StaticPool)
        kwargs.setdefault("connect_args", {"check_same_thread": False})
    engine = sa.create_engine(url, **kwargs)
    prepare_engine(engine)
    return engine


def postgres_socket_deadlines(seconds: float) -> dict[str, Any]:
    """libpq connection options (``connect_args``) that bound a PostgreSQL connection's socket to
    about ``seconds``: ``connect_timeout`` (a connect that is never answered, e.g. a black-holed
    address), TCP keepalives and ``tcp_user_timeout`` (an open connection whose peer is gone: sent
    bytes never acknowledged). What they cannot bound is a peer that acknowledges and never
    answers (a frozen proxy or backend); ``statement_timeout`` is the server's own.

    The watchdog's engines (``onceflow.watchdog.runner.bounded_engine``) and the read-only engines
    (``onceflow.opsview.sources.create_read_engine``, also the run-notes listener's) use them.
    """
    return {
        "connect_timeout": max(1, int(seconds)),
        "keepalives": 1,
        "keepalives_idle": max(1, int(seconds / 2)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": int(seconds * 1000),
    }


def is_sqlite(engine_or_conn: Engine | Connection) -> bool:
    """Whether the engine or connection talks to SQLite."""
    return engine_or_conn.dialect.name == "sqlite"


def use_wal(dbapi_connection: Any, timeout_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000) -> None:
    """Switch a new SQLite connection's file to WAL journaling, waiting out other openers.

    Switching needs the file's exclusive lock, and SQLite answers "database is locked" at once,
    without its busy handler, when other connections are opening the same new file at that moment
    (a backfill's first wave of tasks, or CI's six concurrent schema creators): retry with jitter
    until ``timeout_s``, as the busy timeout would. A file already in WAL is left alone.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        cursor = dbapi_connection.cursor()
        try:
            (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
            if str(mode).lower() not in ("wal", "memory"):  # an in-memory database keeps "memory"
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        finally:
            cursor.close()
        time.sleep(random.uniform(0.005, 0.05))


def prepare_engine(engine: Engine) -> Engine:
    """Install the SQLite transaction rules on ``engine`` (idempotent; PostgreSQL is left alone)."""
    if not is_sqlite(engine) or getattr(engine, _PREPARED_FLAG, False):
        return engine

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself instead of pysqlite's implicit BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()
        use_wal(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    setattr(engine, _PREPARED_FLAG, True)
    return engine
