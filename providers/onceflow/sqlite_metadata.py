"""Airflow's metadata database on SQLite (``make run``'s embedded default) with many processes on it.

The scheduler, dag-processor, triggerer, api-server and every task write to one file. In SQLite's
default rollback-journal mode a reader holds a lock that keeps a writer from committing, and the
api-server's UI reads all the time; Python's sqlite3 waits 5 s for a lock, then raises "database
is locked". On a loaded 2-core machine that hit a person creating a backfill in the UI (Airflow
answers it with 503: "Backfill creation is not supported on SQLite under concurrent access").
Two settings make it hold: write-ahead logging (readers and the one writer no longer block each
other; the mode is stored in the file, so set once after ``airflow db migrate``) and a longer lock
wait for what is left (writer against writer). Airflow recommends PostgreSQL beyond a demo; so do we.
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
