"""The Celery topology's refusals and its process-tree lookup, without starting Airflow."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.cli import main
from onceflow.testing.airflow_cluster import ClusterError
from onceflow.testing.celery_cluster import CeleryCluster
from onceflow.testing.processes import session_members


def test_the_celery_cluster_refuses_a_sqlite_metadata_db(tmp_path: Path) -> None:
    base = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'a.db'}",
        "AIRFLOW_HOME": str(tmp_path),
    }
    with pytest.raises(
        ClusterError, match=r"needs a PostgreSQL metadata database.*ONCEFLOW_TEST_DATABASE_URL"
    ):
        CeleryCluster(base, tmp_path / "cluster")
    assert not (tmp_path / "cluster").exists(), "refused before creating anything"


def test_onceflow_up_celery_without_postgres_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ONCEFLOW_UP_DATABASE_URL", raising=False)
    home = tmp_path / "home"
    assert main(["up", "--executor", "celery", "--home", str(home)]) == 2
    assert "ONCEFLOW_UP_DATABASE_URL" in capsys.readouterr().err
    assert not home.exists()
    monkeypatch.setenv("ONCEFLOW_UP_DATABASE_URL", f"sqlite:///{tmp_path / 'x.db'}")
    assert main(["up", "--executor", "celery", "--home", str(home)]) == 2


def test_session_members_follow_children_that_left_the_session() -> None:
    # a session leader whose child starts a session of its own (as a task process might)
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(session_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        members = session_members(leader.pid)
        assert leader.pid in members and len(members) == 2
    finally:
        for pid in session_members(leader.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        leader.wait(timeout=10)
