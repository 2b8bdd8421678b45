"""Every DAG file parses cleanly, carries its metadata, and does no I/O at parse time.

The folder is parsed in a subprocess inside a network namespace with no interfaces
(``unshare --net``), with an audit hook that records network, subprocess and file-write events,
so a DAG that builds a client or opens a connection at parse time fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onceflow.testing.parse_guard import read_report

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
ONCEFLOW_CODE = (str(REPO / "providers" / "onceflow"), str(DAGS))


def _parse(folder: Path, tmp_path: Path, network_namespace: bool = True) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "onceflow.testing.parse_guard", str(folder)]
    if network_namespace:
        if not shutil.which("unshare"):
            pytest.fail("unshare (util-linux) is needed to parse without a network")
        cmd = ["unshare", "--net", *cmd]
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(folder),
    }
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_report(proc.stdout)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _parse(DAGS, tmp_path_factory.mktemp("parse"))


def test_every_dag_file_parses_without_import_errors(report: dict[str, Any]) -> None:
    assert report["import_errors"] == {}
    files = {p.name for p in DAGS.glob("*.py") if not p.name.startswith("_")}
    parsed_files = {Path(d["fileloc"]).name for d in report["dags"].values()}
    assert files == parsed_files, f"files that define no DAG: {files - parsed_files}"


def test_design_card_dags_present(report: dict[str, Any]) -> None:
    present = set(report["dags"])
    assert {"sheet_claim", "article_pipeline", "sheet_reconcile", "daily_sales"} <= present


def test_every_dag_has_owner_tags_doc_and_retries(report: dict[str, Any]) -> None:
    problems = []
    for dag_id, info in report["dags"].items():
        if not info["owners"] or "airflow" in info["owners"]:
            problems.append(f"{dag_id}: owner must be set (got {info['owners']})")
        if not info["tags"]:
            problems.append(f"{dag_id}: no tags")
        if not info["doc_md"]:
            problems.append(f"{dag_id}: no doc_md")
        if info["min_retries"] is None or info["min_retries"] < 1:
            problems.append(f"{dag_id}: a task has no retries")
    assert problems == []


def test_parsing_does_no_network_subprocess_or_writes(report: dict[str, Any]) -> None:
    assert report["violations"] == []


def test_no_warnings_from_onceflow_code(report: dict[str, Any]) -> None:
    ours = [w for w in report["warnings"] if w["filename"].startswith(ONCEFLOW_CODE)]
    assert ours == []


def test_the_guard_catches_a_dag_that_connects_at_parse_time(tmp_path: Path) -> None:
    """The check above can fail: a DAG that opens a socket at module level is reported."""
    bad = tmp_path / "bad_dags"
    bad.mkdir()
    (bad / "greedy.py").write_text(
        "import socket, pendulum\n"
        "from airflow.sdk import dag, task\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 9), timeout=0.2)\n"
        "except OSError:\n"
        "    pass\n"
        "@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1), tags=['x'], doc_md='x')\n"
        "def greedy():\n"
        "    @task\n"
        "    def t():\n"
        "        pass\n"
        "    t()\n"
        "greedy()\n"
    )
    report = _parse(bad, tmp_path)
    assert "greedy" in report["dags"]
    assert "socket.connect" in {v["event"] for v in report["violations"]}
