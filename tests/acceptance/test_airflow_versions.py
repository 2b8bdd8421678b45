"""The built wheel works on every Airflow minor version pyproject.toml declares.

For each supported minor a clean venv gets that Airflow and the wheel with all its extras; every
DAG of ``dags/`` must import and survive serialization there, and one ``dag.test()`` of
``daily_sales`` must load a day whose stored rows match the cleaning of the same generated orders
computed here, in the test's own environment. On the oldest supported minor (3.1), a second test
(``slow``) runs the first task of every other DAG by ``dag.test()`` (what ``airflow dags test`` runs) with the rest
of the DAG marked success (``mark_success_pattern``), all in one process against the Sheets
emulator (127.0.0.1) and SQLite: ``sheet_claim``'s sensor, ``article_pipeline``'s and its recheck
lane's ``read_claimed_row``, ``recheck``'s ``start``, ``sheet_reconcile``, ``ledger_reconcile``'s
relay, ``heartbeat``'s beat and ``sales_dashboard``'s render; the article's ledger item and its
sheet row are read back here.

Airflow is installed as its users install it: with the constraints of its release. Those files
are not reachable from CI, so uv resolves everything as of the release day (``--exclude-newer``),
which is what the constraints captured; resolving against today's index instead pulls libraries
newer than the release (FastAPI, cadwyn) that break its in-process Execution API.

The venvs are cached under ``$ONCEFLOW_VENV_CACHE`` (default ``~/.cache/onceflow/airflow-venvs``)
in a folder named by the hash of ``uv.lock``, so a repeat run only reinstalls the wheel. ``make
install`` builds them (``wheel_env.prepare``, with the network); here uv runs offline.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
import sys
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import tomllib
from wheel_env import RELEASES, REPO, airflow_venv, check_run, clean_env, last_json_line

from onceflow.compat import OLDEST_SUPPORTED_AIRFLOW

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

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


# On the oldest supported minor, each DAG's first task run by dag.test() (what `airflow dags test`
# runs), every other task marked success by its mark_success_pattern: one process for all DAGs.
# The plan names the DAGs in order and their confs; recheck's start re-opens the article that
# article_pipeline's first step finished, and article_pipeline_recheck gets the conf
# RecheckDispatchOperator would give it.
FIRST_TASKS = """
import json, re, sys
from onceflow.compat import dagbag_module
from onceflow.testing.dag_runner import run_dag
plan = json.loads(sys.argv[2])
bag = dagbag_module().DagBag(sys.argv[1])
out = {}
for dag_id in plan["order"]:
    conf = plan["conf"].get(dag_id)
    if dag_id == "article_pipeline_recheck":
        started = out["recheck"]["start"]
        [key] = started["work_keys"]
        conf = {"work_key": key, "recheck_id": started["recheck_id"], "reason": "first task",
                "target_version": "v1", "onceflow_lane": "recheck"}
    dag = bag.dags[dag_id]
    [first] = [t.task_id for t in dag.roots]
    print(f"running {dag_id}.{first}", file=sys.stderr, flush=True)
    result = run_dag(dag, conf=conf, mark_success_pattern=f"(?!{re.escape(first)}$).*")
    out[dag_id] = {"first": first, "state": result.state, "tis": result.ti_states,
                   "pushed": sorted({task for task, _ in result.xcoms}), "run_id": result.run_id}
    if dag_id == "recheck":
        out[dag_id]["start"] = result.xcom("start")
print("FIRST " + json.dumps(out))
"""
FIRST_TASK_ORDER = [
    "sheet_claim",  # its sensor sees the second row NEW (the test claimed the first)
    "article_pipeline",  # read_claimed_row of the row the test claimed
    "recheck",
    "article_pipeline_recheck",
    "article_batch",  # read_claimed_row of a batch of the second row (after the recheck's sample)
    "sheet_reconcile",
    "ledger_reconcile",
    "heartbeat",
    "sales_dashboard",
]
#: DAG -> its task group mapped over a task the plan marks success (so never expanded).
UNEXPANDED = {"article_batch": "review_article"}
SHEET_HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]


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


def _sqlite_conn(path: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(path)})


def _airflow_env(tmp_path: Path, data: Path) -> dict[str, str]:
    """A private AIRFLOW_HOME with this repository's DAGs and plugins, its databases SQLite files."""
    return {
        **clean_env(),
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": _sqlite_conn(data / "shop.db"),
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": _sqlite_conn(data / "warehouse.db"),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": _sqlite_conn(data / "ledger.db"),
    }


@pytest.fixture(scope="module")
def repository_dags() -> object:
    """Every DAG and import error as this repository's own environment parses them (once)."""
    env = {
        **clean_env(),
        "PYTHONPATH": os.pathsep.join(sys.path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    listed = check_run([sys.executable, "-c", LIST_DAGS, str(REPO / "dags")], env=env)
    return last_json_line(listed.stdout, "DAGS ")


@pytest.mark.parametrize("minor", _supported_minors())
def test_wheel_imports_every_dag_and_runs_daily_sales(
    minor: str, wheel: Path, tmp_path: Path, repository_dags: object
) -> None:
    from onceflow.sales.generator import GeneratorConfig
    from onceflow.testing.sales_fixtures import clean_day

    venv = airflow_venv(minor, wheel)
    bin_ = venv / "bin"
    data = tmp_path / "data"
    data.mkdir()
    env = _airflow_env(tmp_path, data)
    version = check_run([str(bin_ / "python"), "-c", "import airflow; print(airflow.__version__)"], env=env)
    assert version.stdout.strip() == RELEASES[minor][0]

    check_run([str(bin_ / "airflow"), "db", "migrate"], env=env)
    # What the repository's own environment parses, with the source tree on the path.
    expected = repository_dags
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


@pytest.mark.slow  # each dag.test() task costs seconds of Airflow start-up: about a minute in all
def test_first_task_of_every_dag_runs_on_the_oldest_minor(
    wheel: Path, tmp_path: Path, repository_dags: object, sheets_emulator: SheetsEmulator
) -> None:
    """Each DAG's first task on the oldest minor's Airflow, against the Sheets emulator and SQLite
    (daily_sales's whole run is in the test above)."""
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.sheets import ledger_link
    from onceflow.sheets.keys import BATCH_RUN_KEY, batch_run_id
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

    assert isinstance(repository_dags, dict)
    assert sorted([*FIRST_TASK_ORDER, "daily_sales"]) == sorted(repository_dags["dags"]), "a DAG left out"
    venv = airflow_venv(OLDEST_SUPPORTED_AIRFLOW, wheel)
    data = tmp_path / "data"
    data.mkdir()
    env = _airflow_env(tmp_path, data)
    check_run([str(venv / "bin" / "airflow"), "db", "migrate"], env=env)
    emulator = sheets_emulator  # on 127.0.0.1
    urls = [f"https://news.example/first-task/{n}" for n in (1, 2, 3)]
    sid = emulator.create_spreadsheet(
        "articles", sheets={"queue": [SHEET_HEADER, *[[u, "NEW"] for u in urls]]}
    )
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid), spread=1)
    claim, batched = queue.claim(2).claims
    ledger_url = f"sqlite:///{data / 'ledger.db'}"
    engine = create_ledger_engine(ledger_url)
    # the second row as sheet_claim with a batch_size registers it: one batch of one
    batch_claim = {**batched.conf(sid, "queue", "v1"), BATCH_RUN_KEY: batch_run_id(batched.token)}
    record = ledger_link.ClaimRecord(batched.row_key, batched.row_number, batched.token, batch_claim)
    assert len(ledger_link.register_claims(Ledger(engine), [record])) == 1
    plan = {
        "order": FIRST_TASK_ORDER,
        "conf": {
            "sheet_claim": {"max_rows": 10, "processing_version": "v1"},
            "article_pipeline": claim.conf(sid, "queue", "v1"),
            "article_batch": {"claims": [batch_claim]},
            "recheck": {"scope": "quality_sample", "reason": "first task on the oldest minor"},
            "sheet_reconcile": {"lease_minutes": 60, "processing_version": "v1", "max_redrives": 3},
        },
    }
    run_env = {
        **env,
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": emulator.connection_json(spreadsheet_id=sid),
        "ONCEFLOW_DASHBOARD_DIR": str(data / "dashboard"),
    }
    done = check_run(
        [str(venv / "bin" / "python"), "-c", FIRST_TASKS, str(REPO / "dags"), json.dumps(plan)], env=run_env
    )
    ran = last_json_line(done.stdout, "FIRST ")
    assert isinstance(ran, dict) and list(ran) == FIRST_TASK_ORDER
    for dag_id, outcome in ran.items():
        first = outcome["first"]
        # article_batch's review group is mapped over what mark_needs_review returns; marked success
        # without running, it returned nothing, so the group cannot expand and its run ends failed
        unexpanded = {t: s for t, s in outcome["tis"].items() if t.startswith(f"{UNEXPANDED.get(dag_id)}.")}
        assert set(unexpanded.values()) <= {"upstream_failed"}, (dag_id, outcome["tis"])
        assert bool(unexpanded) == (dag_id in UNEXPANDED), (dag_id, outcome["tis"])
        assert outcome["state"] == ("failed" if unexpanded else "success"), (dag_id, outcome["tis"])
        # it ran and returned its result; the tasks marked success never ran, so pushed nothing
        assert outcome["pushed"] == [first], (dag_id, outcome)
        assert {s for t, s in outcome["tis"].items() if t not in unexpanded} == {"success"}, (dag_id, outcome)
    # read back here, not through the child: the article's ledger item and its sheet row
    try:
        item = Ledger(engine).item(ledger_link.work_key(claim.row_key))
    finally:
        engine.dispose()
    assert item.state == "done"
    assert queue.find(claim.token).get("run_id") == ran["article_pipeline_recheck"]["run_id"]
    assert queue.find(batched.token).get("run_id") == ran["article_batch"]["run_id"]
    assert ran["recheck"]["start"]["selected"] == 1
    assert list((data / "dashboard").iterdir()), "sales_dashboard's render wrote nothing"
