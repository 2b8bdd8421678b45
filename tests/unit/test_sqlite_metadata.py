"""``make run``'s SQLite metadata database under many processes (onceflow.sqlite_metadata).

Found by the README's demo in Chromium at a load average of 12: creating a backfill in the UI was
answered 503 "Database is locked" because, in SQLite's rollback-journal mode, the readers the UI
keeps open stop a writer's commit, and sqlite3 gives up after 5 s.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from onceflow import sqlite_metadata
from onceflow.local_run import sqlite_metadata_settings

if TYPE_CHECKING:
    from pathlib import Path


def _table(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE backfill (id INTEGER PRIMARY KEY, dag_id TEXT)")


def _reader_holds_a_read(path: Path) -> sqlite3.Connection:
    """A connection inside a read transaction, as a UI request mid-query is."""
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM backfill").fetchone()
    return reader


def _write(path: Path) -> None:
    with sqlite3.connect(path, timeout=0.2) as writer:
        writer.execute("INSERT INTO backfill (dag_id) VALUES ('daily_sales')")


def test_in_the_default_journal_mode_an_open_reader_locks_a_writer_out(tmp_path: Path) -> None:
    db = tmp_path / "airflow.db"
    _table(db)
    reader = _reader_holds_a_read(db)
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            _write(db)
    finally:
        reader.close()


def test_in_write_ahead_log_mode_the_writer_commits_beside_an_open_reader(tmp_path: Path) -> None:
    db = tmp_path / "airflow.db"
    _table(db)
    assert sqlite_metadata.use_write_ahead_log(db) == "wal"
    reader = _reader_holds_a_read(db)
    try:
        _write(db)  # no lock wait at all: 0.2 s would not be enough otherwise
        assert reader.execute("SELECT count(*) FROM backfill").fetchone() == (0,), "the reader's snapshot"
    finally:
        reader.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM backfill").fetchone() == (1,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",), "kept in the file"


def test_a_file_that_cannot_switch_says_so(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="journal_mode=memory"):
        sqlite_metadata.use_write_ahead_log(":memory:")  # type: ignore[arg-type]


def test_make_runs_sqlite_metadata_gets_the_lock_wait_and_airflow_reads_it(tmp_path: Path) -> None:
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}"}
    assert sqlite_metadata_settings(env) is True
    child = {**os.environ, **env, "AIRFLOW_HOME": str(tmp_path)}
    read = subprocess.run(
        [sys.executable, "-c", "import json; from airflow.configuration import conf; "
         "print(json.dumps(conf.getimport('database', 'sql_alchemy_connect_args')))"],
        env=child, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(read.stdout.strip().splitlines()[-1])["timeout"] >= 30


def test_a_postgres_metadata_database_gets_no_sqlite_argument() -> None:
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://postgres@127.0.0.1/airflow"}
    assert sqlite_metadata_settings(env) is False
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" not in env
