"""The heartbeat DAG: its pool and weight, and the schedule setting (cron or ``<n>s``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(sys.argv[1])
dag = bag.dags["heartbeat"]
[beat] = dag.tasks
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "pool": beat.pool, "weight": beat.priority_weight, "rule": str(beat.weight_rule),
    "timetable": type(dag.timetable).__name__, "expression": getattr(dag.timetable, "expression", None),
    "delta": getattr(getattr(dag.timetable, "delta", None), "total_seconds", lambda: None)(),
    "catchup": dag.catchup, "max_active_runs": dag.max_active_runs,
    "sqlalchemy_engines": "onceflow.watchdog.schema" in sys.modules,
}))
"""


def _parse(tmp_path: Path, schedule: str | None) -> dict[str, object]:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop("ONCEFLOW_HEARTBEAT_SCHEDULE", None)
    if schedule is not None:
        env["ONCEFLOW_HEARTBEAT_SCHEDULE"] = schedule
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "heartbeat.py").write_text((DAGS / "heartbeat.py").read_text())
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, str(folder)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("schedule", "timetable", "key", "value"),
    [
        (None, "CronTriggerTimetable", "expression", "* * * * *"),
        ("*/2 * * * *", "CronTriggerTimetable", "expression", "*/2 * * * *"),
        ("10s", "DeltaTriggerTimetable", "delta", 10.0),
    ],
    ids=["default", "cron", "seconds"],
)
def test_the_beat_is_one_top_priority_task_in_its_own_pool(
    tmp_path: Path, schedule: str | None, timetable: str, key: str, value: object
) -> None:
    info = _parse(tmp_path, schedule)
    assert info["errors"] == {}
    assert info["pool"] == "onceflow_heartbeat"
    assert info["weight"] == 2**31 - 1 and info["rule"] == "absolute"
    assert info["timetable"] == timetable, info
    assert info[key] == value, info
    assert (info["catchup"], info["max_active_runs"]) == (False, 1)
    assert info["sqlalchemy_engines"] is False  # the hook's imports wait for the task
