"""The built wheel works on every Airflow minor version pyproject.toml declares.

For each supported minor a clean venv gets that Airflow and the wheel with all its extras; every
DAG of ``dags/`` must import and survive serialization there, and one ``dag.test()`` of
``daily_sales`` must load a day whose stored rows match the cleaning of the same generated orders
computed here, in the test's own environment.

Airflow is installed as its users install it: with the constraints of its release. Those files
are not reachable from CI, so uv resolves everything as of the release day (``--exclude-newer``),
which is what the constraints captured; resolving against today's index instead pulls libraries
newer than the release (FastAPI, cadwyn) that break its in-process Execution API.

The venvs are cached under ``$ONCEFLOW_VENV_CACHE`` (default ``~/.cache/onceflow/airflow-venvs``)
in a folder named by the hash of ``uv.lock``, so a repeat run only reinstalls the wheel.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import shutil
import sqlite3
import sys
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import tomllib
from wheel_env import RELEASES, REPO, build_wheel, cache_root, check_run, clean_env, last_json_line, uv_cmd

from onceflow.compat import OLDEST_SUPPORTED_AIRFLOW

DAY = dt.date(2026, 1, 1)  # the day daily_sales loads

# Every DAG file of the folder imported and round-tripped through Airflow's serialization (what
# the dag-processor stores and the scheduler reads back).
LIST_DAGS = """
import json, os, sys
try:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization as Ser
except ImportError:  # before 3.3
    from airflow.models.dagbag import DagBag
    from airflow.serialization.serialized_objects import SerializedDAG as Ser
bag = DagBag(dag_folder=sys.argv[1])  # AIRFLOW__CORE__LOAD_EXAMPLES=False
errors = {os.path.basename(k): v.strip().splitlines()[-1] for k, v in bag.import_errors.items()}
for dag_id, dag in bag.dags.items():
    try:
        Ser.from_dict(Ser.to_dict(dag))
    except Exception as exc:
        errors[dag_id] = f"serialization: {exc!r}"
print("DAGS " + json.dumps({"dags": sorted(bag.dag_ids), "errors": errors}))
"""

# One dag.test() of daily_sales for the run whose data interval is DAY (onceflow's run_dag, as
# in the repository's own tests).
RUN_DAILY_SALES = """
import datetime as dt, json, sys
from onceflow.testing.dag_runner import load_dag, run_dag
day = dt.date.fromisoformat(sys.argv[1])
after = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.timezone(dt.timedelta(hours=1)))
result = run_dag(load_dag("daily_sales"), logical_date=after)
print("RUN " + json.dumps({"state": result.state, "tis": result.ti_states,
                           "start": result.data_interval_start.isoformat()}))
"""


def _declared_minors() -> list[str]:
    """Minors from pyproject's ``apache-airflow>=X.Y`` up to the locked one."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"apache-airflow\s*[><=]", d))
    low = re.search(r">=\s*3\.(\d+)", spec)
    assert low, spec
    high = int(installed_version("apache-airflow").split(".")[1])
    return [f"3.{m}" for m in range(int(low.group(1)), high + 1)]


def _supported_minors() -> list[str]:
    oldest = int(OLDEST_SUPPORTED_AIRFLOW.split(".")[1])
    return [m for m in _declared_minors() if int(m.split(".")[1]) >= oldest]


def test_declared_lower_bound_is_the_oldest_supported_minor() -> None:
    assert _declared_minors()[0] == OLDEST_SUPPORTED_AIRFLOW, (
        f"pyproject.toml declares Airflow {_declared_minors()[0]}, which onceflow cannot support "
        f"(onceflow.compat.OLDEST_SUPPORTED_AIRFLOW, docs/deploy.md): declare "
        f"apache-airflow>={OLDEST_SUPPORTED_AIRFLOW},<4"
    )


def test_every_declared_minor_has_a_tested_release() -> None:
    assert set(_declared_minors()) <= set(RELEASES), f"add a row to RELEASES for {_declared_minors()}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


def _venv(minor: str, wheel: Path) -> Path:
    """The cached venv of ``minor`` (built once per uv.lock), with this build of the wheel in it."""
    version, resolved_as_of = RELEASES[minor]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"airflow-{version}"
    env = clean_env()
    install = [*uv_cmd(), "pip", "install", "--python", str(venv / "bin" / "python")]
    install += ["--exclude-newer", resolved_as_of]
    with open(root / f"airflow-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions share the cache: one builds, one waits
        if not (venv / ".complete").exists():  # a venv killed half-way is built again
            shutil.rmtree(venv, ignore_errors=True)
            check_run([*uv_cmd(), "venv", "--python", sys.executable, str(venv)], env=env)
            check_run([*install, f"apache-airflow=={version}", f"{wheel}[all]"], env=env)
            (venv / ".complete").touch()
        else:
            reinstall = ["--reinstall-package", "airflow-provider-onceflow"]
            check_run([*install, *reinstall, f"apache-airflow=={version}", f"{wheel}[all]"], env=env)
    return venv


def _sqlite_conn(path: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(path)})


@pytest.mark.parametrize("minor", _supported_minors())
def test_wheel_imports_every_dag_and_runs_daily_sales(minor: str, wheel: Path, tmp_path: Path) -> None:
    from onceflow.sales.generator import GeneratorConfig
    from onceflow.testing.sales_fixtures import clean_day

    venv = _venv(minor, wheel)
    bin_ = venv / "bin"
    data = tmp_path / "data"
    data.mkdir()
    env = {
        **clean_env(),
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": _sqlite_conn(data / "shop.db"),
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": _sqlite_conn(data / "warehouse.db"),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": _sqlite_conn(data / "ledger.db"),
    }
    version = check_run([str(bin_ / "python"), "-c", "import airflow; print(airflow.__version__)"], env=env)
    assert version.stdout.strip() == RELEASES[minor][0]

    check_run([str(bin_ / "airflow"), "db", "migrate"], env=env)
    # What the repository's own environment parses, with the source tree on the path.
    here = {**env, "PYTHONPATH": os.pathsep.join(sys.path)}
    expected = last_json_line(
        check_run([sys.executable, "-c", LIST_DAGS, str(REPO / "dags")], env=here).stdout, "DAGS "
    )
    assert isinstance(expected, dict) and expected["errors"] == {}
    listed = last_json_line(
        check_run([str(bin_ / "python"), "-c", LIST_DAGS, str(REPO / "dags")], env=env).stdout, "DAGS "
    )
    assert listed == expected

    # Orders from three days before DAY: refunds arrive up to 72 hours late.
    start, end = DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=2)
    shop = f"sqlite:///{data / 'shop.db'}"
    check_run(
        [
            str(bin_ / "onceflow"),
            "sales",
            "generate",
            "--url",
            shop,
            "--start",
            str(start),
            "--end",
            str(end),
        ],
        env=env,
    )
    run = last_json_line(
        check_run([str(bin_ / "python"), "-c", RUN_DAILY_SALES, DAY.isoformat()], env=env).stdout, "RUN "
    )
    assert run == {
        "state": "success",
        "tis": {"extract": "success", "clean": "success", "load": "success"},
        "start": "2025-12-31T23:00:00+00:00",  # DAY 00:00 Europe/Amsterdam
    }

    # The partition read back with plain SQL, against the cleaning computed in this environment.
    reference = clean_day(DAY, GeneratorConfig())
    with sqlite3.connect(data / "warehouse.db") as db:
        stored = db.execute(
            "SELECT count(*), sum(net_cents) FROM daily_sales WHERE partition_date = ?", (str(DAY),)
        ).fetchone()
        rejects = db.execute("SELECT count(*) FROM rejects WHERE partition_key = ?", (str(DAY),)).fetchone()[
            0
        ]
    assert stored == (len(reference.rows), int(reference.rows["net_cents"].sum()))
    assert rejects == len(reference.rejects)
