"""The preload works beside a cluster's own ``airflow_local_settings.py``: the documented two
lines appended to an existing file keep that file's policies and preload in the scheduler.

Real Airflow imports the file (``airflow.settings.import_local_settings``, when Airflow
initialises, as every Airflow process does at start) in a subprocess whose ``sys.argv`` is the scheduler's or the api-server's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# An existing cluster's settings: a task policy of its own.
THEIRS = """
def task_policy(task):
    task.owner = "platform-team"
"""


def _documented_lines() -> str:
    doc = (REPO / "docs" / "deploy.md").read_text()
    section = doc.split("### The preload beside your airflow_local_settings.py", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


PROBE = """
import json, sys
sys.argv = ["airflow", *sys.argv[1:]]
import airflow  # initialising Airflow imports airflow_local_settings, as in every Airflow process
local = sys.modules["airflow_local_settings"]
print("PROBE " + json.dumps({"parquet": "pyarrow.parquet" in sys.modules, "policy": hasattr(local, "task_policy"),
                             "theirs": getattr(local.task_policy, "__module__", None)}))
"""


@pytest.mark.parametrize(("command", "preloads"), [(["scheduler"], True), (["api-server"], False)])
def test_the_documented_lines_preload_beside_an_existing_settings_file(
    tmp_path: Path, command: list[str], preloads: bool
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "airflow_local_settings.py").write_text(THEIRS + _documented_lines())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(config), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *command], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))
    assert json.loads(line[6:]) == {"parquet": preloads, "policy": True, "theirs": "airflow_local_settings"}
