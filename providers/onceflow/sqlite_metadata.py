"""Airflow's metadata database on SQLite (``make run``'s embedded default) with many processes on it.

The scheduler, dag-processor, triggerer, api-server and every task write to one file. In SQLite's
default rollback-journal mode a reader holds a lock that keeps a writer from committing, and the
api-server's UI reads all the time; Python's sqlite3 waits 5 s for a lock, then raises "database
is locked". On a loaded 2-core machine that hit a person creating a backfill in the UI (Airflow
answers it with 503: "Backfill creation is not supported on SQLite under concurrent access").
Two settings make it hold: write-ahead logging (readers and the one writer no longer block each
other; the mode is stored in the file, so set once after ``airflow db migrate``) and a longer lock
wait for what is left (writer against writer). Airflow recommends PostgreSQL beyond a demo; so do we.
The lock wait does not cover one case: a transaction that read, then writes after another process
committed, fails at once. Airflow's backfill creation then deletes runs the scheduler already
started, and the scheduler dies; :func:`write_lock_at_begin` prevents it for the CLI
(:mod:`onceflow.sqlite_cli`), not for a backfill created in the UI.
Kept tiny: every Airflow process of ``make run`` imports it (``sql_alchemy_connect_args``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

#: ``[database] sql_alchemy_connect_args`` for a SQLite metadata database: how long a connection
#: waits for another writer's lock before "database is locked" (sqlite3's default is 5 s).
CONNECT_ARGS: dict[str, Any] = {"timeout": 60.0}

#: The value of ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS`` that points Airflow at it.
CONNECT_ARGS_PATH = f"{__name__}.CONNECT_ARGS"


def use_write_ahead_log(database: Path) -> str:
    """Put the SQLite file ``database`` in WAL mode (kept in the file); the mode it reports."""
    with sqlite3.connect(database, timeout=CONNECT_ARGS["timeout"]) as conn:
        mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
    if mode.lower() != "wal":
        raise RuntimeError(f"{database}: SQLite kept journal_mode={mode} (a read-only file or directory?)")
    return mode


def write_lock_at_begin(target: Any) -> None:
    """Start every pysqlite transaction of ``target`` with ``BEGIN IMMEDIATE`` (write lock first).

    ``target`` is an ``Engine``, or the ``Engine`` class for every engine of the process (the
    Airflow CLI makes its own). Airflow 3.3's backfill creation goes wrong on SQLite in two ways
    this prevents, and together they killed the scheduler (benchmarks/README.md, "On SQLite"):

    * pysqlite emits no ``BEGIN`` before a ``SAVEPOINT``, so SQLite opens the transaction at the
      savepoint and its ``RELEASE`` commits it: ``_create_backfill`` commits each run (with its
      task instances) on its own, and the scheduler starts them while later ones are still made.
    * in write-ahead-log mode a transaction that read and then writes after another process
      committed fails at once with "database is locked" (a stale snapshot: the lock wait does not
      apply). ``_create_backfill`` then deletes the backfill's runs, those already running too.

    Holding the write lock from ``BEGIN`` makes the snapshot current and the savepoints nest in
    one transaction: the backfill appears whole or not at all. Other writers wait meanwhile, so
    this suits short commands (the CLI: :mod:`onceflow.sqlite_cli`), not long-lived processes.
    """
    from sqlalchemy import event

    def no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.isolation_level = None  # the listener below opens every transaction

    def begin_immediate(conn: Any) -> None:
        if conn.dialect.name == "sqlite" and conn.dialect.driver == "pysqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(target, "connect", no_implicit_begin)
    event.listen(target, "begin", begin_immediate)
