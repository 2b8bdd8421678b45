"""Why ``airflow backfill create`` killed the scheduler on a SQLite metadata DB, and the fix.

benchmarks/bench_backfill.py --backend sqlite (2026-12-05): the CLI's INSERT of a backfill's 20th
run failed with "database is locked" at once, Airflow's ``_cleanup_partial_backfill`` deleted the
backfill's runs, the scheduler, already running the first of them, re-created their task instances
(FOREIGN KEY constraint failed: task_instance -> dag_run) and died on ``ObjectDeletedError``. The
two SQLite behaviours behind it are checked here on plain SQLAlchemy sessions, as Airflow's
``_create_backfill`` uses them (a commit, then each run inside ``begin_nested()``), with and
without :func:`onceflow.sqlite_metadata.write_lock_at_begin`.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from onceflow import sqlite_metadata
from onceflow.testing.airflow_cluster import AirflowCluster

if TYPE_CHECKING:
    from pathlib import Path


def _metadata_db(path: Path, *, write_lock_at_begin: bool) -> sa.Engine:
    """A WAL-mode file (Airflow 3.3 switches every SQLite connection to WAL) and its engine."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE dag_run (id INTEGER PRIMARY KEY, run_id TEXT)")
    sqlite_metadata.use_write_ahead_log(path)
    engine = sa.create_engine(f"sqlite:///{path}", connect_args=dict(sqlite_metadata.CONNECT_ARGS))
    if write_lock_at_begin:
        sqlite_metadata.write_lock_at_begin(engine)
    return engine


def _runs_seen_by_another_process(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM dag_run").fetchone()[0])


def _first_run_of_a_backfill(engine: sa.Engine, path: Path) -> tuple[int, int]:
    """Runs another process sees after the first run's savepoint, and after the backfill fails."""
    with Session(engine) as session:
        session.execute(sa.text("SELECT 1"))
        session.commit()  # _create_backfill commits the backfill row first
        session.execute(sa.text("SELECT count(*) FROM dag_run"))
        with session.begin_nested():
            session.execute(sa.text("INSERT INTO dag_run (run_id) VALUES ('backfill__1')"))
        during = _runs_seen_by_another_process(path)
        session.rollback()  # a later run failed
    return during, _runs_seen_by_another_process(path)


def test_pysqlite_commits_each_run_when_its_savepoint_is_released(tmp_path: Path) -> None:
    db = tmp_path / "airflow.db"
    during, after = _first_run_of_a_backfill(_metadata_db(db, write_lock_at_begin=False), db)
    assert (during, after) == (1, 1), "the savepoint opened the transaction; its RELEASE committed it"


def test_with_the_write_lock_at_begin_the_runs_commit_with_their_backfill(tmp_path: Path) -> None:
    db = tmp_path / "airflow.db"
    during, after = _first_run_of_a_backfill(_metadata_db(db, write_lock_at_begin=True), db)
    assert (during, after) == (0, 0)


def _read_then_write_after_another_commit(engine: sa.Engine, path: Path) -> None:
    """One run as ``_create_backfill_dag_run_non_partitioned`` makes it: in a savepoint, look for
    the run, then insert it; the scheduler tries to commit in between (with 0.2 s of lock wait)."""
    with Session(engine) as session:
        with session.begin_nested():
            session.execute(sa.text("SELECT count(*) FROM dag_run"))
            try:
                with sqlite3.connect(path, timeout=0.2) as other:
                    other.execute("INSERT INTO dag_run (run_id) VALUES ('scheduler')")
            except sqlite3.OperationalError:
                pass  # it waits for this transaction instead
            session.execute(sa.text("INSERT INTO dag_run (run_id) VALUES ('backfill__2')"))
        session.commit()


def test_in_wal_mode_a_write_after_another_commit_fails_at_once_despite_the_lock_wait(
    tmp_path: Path,
) -> None:
    db = tmp_path / "airflow.db"
    engine = _metadata_db(db, write_lock_at_begin=False)
    started = time.monotonic()
    with pytest.raises(sa.exc.OperationalError, match="database is locked"):
        _read_then_write_after_another_commit(engine, db)
    assert time.monotonic() - started < sqlite_metadata.CONNECT_ARGS["timeout"] / 10, "no lock wait"


def test_with_the_write_lock_at_begin_no_commit_gets_between_the_read_and_the_write(
    tmp_path: Path,
) -> None:
    db = tmp_path / "airflow.db"
    _read_then_write_after_another_commit(_metadata_db(db, write_lock_at_begin=True), db)
    assert _runs_seen_by_another_process(db) == 1, "only the transaction's own run; the other waited"


def test_the_cli_of_a_sqlite_cluster_takes_the_write_lock_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    def run(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    for url, module in ((f"sqlite:///{tmp_path / 'a.db'}", "onceflow.sqlite_cli"),
                        ("postgresql+psycopg2://postgres@127.0.0.1/x", "airflow")):  # fmt: skip
        base = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url, "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)}
        AirflowCluster(base, tmp_path / "cluster").cli("backfill", "create", "--dag-id", "d")
        assert commands.pop() == [sys.executable, "-m", module, "backfill", "create", "--dag-id", "d"]


def test_onceflow_sqlite_cli_runs_the_airflow_cli(tmp_path: Path) -> None:
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'a.db'}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "onceflow.sqlite_cli", "version"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("3.")
