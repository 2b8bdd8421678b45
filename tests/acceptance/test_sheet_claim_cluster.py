"""The sheet queue through a real Airflow: api-server, scheduler (LocalExecutor), dag-processor, triggerer.

* Twenty deferrable ``NewRowsSensor`` tasks waiting on a 10-slot pool do not stop processing tasks
  in that pool from running (the seed's "sensor deadlock"): waiting happens in the triggerer.
* A claimer killed with SIGKILL between its claim and the run creation: ``sheet_reconcile``
  creates the missing ``article_pipeline`` run, the scheduler runs it, and the row ends with
  exactly one run, whose id is written beside the claim. (Marked slow: three runs through a
  real scheduler take minutes on a busy machine; ``tests/integration/test_sheet_reconcile.py``
  covers the same kill -9 repair, and its idempotence, with ``dag.test()`` in the normal suite.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.sheets import ledger_link
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot
from onceflow.sheets.transport import anonymous_service

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = pytest.mark.real_airflow

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"

SENSOR_WALL = textwrap.dedent(
    '''
    """20 sensors waiting for NEW rows, all in the 10-slot pool onceflow_sheets."""
    import pendulum
    from airflow.sdk import dag
    from onceflow.sensors.sheets import NewRowsSensor

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
         tags=["test"], default_args={"owner": "onceflow", "retries": 0}, max_active_tasks=32)
    def sheet_sensor_wall():
        for i in range(20):
            NewRowsSensor(task_id=f"wait_{i}", pool="onceflow_sheets", poke_interval=2, timeout=900)

    sheet_sensor_wall()
    '''
)

PROCESSING = textwrap.dedent(
    '''
    """Ten short processing tasks in the same pool as the sensors."""
    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
         tags=["test"], default_args={"owner": "onceflow", "retries": 0}, max_active_tasks=32)
    def sheet_processing_probe():
        @task(pool="onceflow_sheets")
        def process(i: int) -> int:
            return i * 2

        for i in range(10):
            process.override(task_id=f"process_{i}")(i)

    sheet_processing_probe()
    '''
)


def _sheet(emulator: SheetsEmulator, rows: list[list[str]]) -> str:
    return emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *rows]})


def _states(cluster: Any, dag_id: str, run_id: str) -> dict[str, str]:
    return {ti["task_id"]: ti["state"] for ti in cluster.task_instances(dag_id, run_id)}


def _wait(predicate: Any, timeout: float, what: str, cluster: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"{what} did not happen in {timeout}s\n{cluster.log_tails()}")


def test_twenty_waiting_sensors_on_a_ten_slot_pool_do_not_block_processing(
    airflow_cluster_factory: Any, sheets_emulator: SheetsEmulator, tmp_path: Path
) -> None:
    sid = _sheet(sheets_emulator, [["https://a.example/done", "DONE #20250101T000000Z-aa"]])
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "sheet_sensor_wall.py").write_text(SENSOR_WALL)
    (dags / "sheet_processing_probe.py").write_text(PROCESSING)
    cluster = airflow_cluster_factory(
        dags_folder=dags,
        env={"AIRFLOW_CONN_ONCEFLOW_SHEETS": sheets_emulator.connection_json(spreadsheet_id=sid)},
        pools={"onceflow_sheets": 10},
        parallelism=16,
    )
    wall = cluster.trigger("sheet_sensor_wall")
    _wait(
        lambda: list(_states(cluster, "sheet_sensor_wall", wall).values()).count("deferred") == 20,
        240,
        "all 20 sensors deferred",
        cluster,
    )
    probe = cluster.trigger("sheet_processing_probe")
    assert cluster.wait_for_run("sheet_processing_probe", probe, timeout=240) == "success"
    assert set(_states(cluster, "sheet_processing_probe", probe).values()) == {"success"}
    assert list(_states(cluster, "sheet_sensor_wall", wall).values()).count("deferred") == 20, (
        "the sensors were still waiting while the processing tasks ran"
    )
    # and the sensors do fire once there is work
    service = anonymous_service(sheets_emulator.endpoint)
    service.spreadsheets().values().append(
        spreadsheetId=sid,
        range="queue",
        valueInputOption="RAW",
        body={"values": [["https://a.example/new", "NEW"]]},
    ).execute()
    assert cluster.wait_for_run("sheet_sensor_wall", wall, timeout=240) == "success"


KILLED_CLAIMER = textwrap.dedent(
    """
    import sys
    from onceflow.hooks.sheets import SheetQueueHook

    result = SheetQueueHook().queue("v1").claim(1)
    print("TOKENS", *[c.token for c in result.claims], flush=True)
    sys.stdin.readline()  # about to create the run: the test kills us here
    raise SystemExit("not killed")
    """
)


@pytest.mark.slow
def test_sheet_reconcile_completes_a_row_whose_claimer_was_killed_with_exactly_one_run(
    airflow_cluster_factory: Any, sheets_emulator: SheetsEmulator, tmp_path: Path
) -> None:
    url = f"https://{uuid.uuid4().hex[:8]}.example/article"
    sid = _sheet(sheets_emulator, [[url, "NEW"]])
    conn = sheets_emulator.connection_json(spreadsheet_id=sid)
    claimer = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLAIMER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "AIRFLOW_CONN_ONCEFLOW_SHEETS": conn},
    )
    assert claimer.stdout is not None
    line = ""
    while not line.startswith("TOKENS"):
        line = claimer.stdout.readline()
        assert line, "claimer exited before claiming"
    os.kill(claimer.pid, signal.SIGKILL)
    assert claimer.wait(timeout=30) == -signal.SIGKILL
    (token,) = line.split()[1:]
    run_id = pipeline_run_id(row_key(normalise_url(url)), "v1")

    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("article_pipeline.py", "sheet_reconcile.py"):
        shutil.copy(REPO_DAGS / name, dags / name)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger_conn = json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": ledger_url}})
    cluster = airflow_cluster_factory(
        dags_folder=dags,
        env={"AIRFLOW_CONN_ONCEFLOW_SHEETS": conn, "AIRFLOW_CONN_ONCEFLOW_LEDGER": ledger_conn},
        pools={"onceflow_sheets": 10},
    )
    params = {"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}
    first = cluster.trigger("sheet_reconcile", conf=params)
    assert cluster.wait_for_run("sheet_reconcile", first, timeout=240) == "success"
    _wait(
        lambda: cluster.run_state("article_pipeline", run_id) is not None, 60, "article run created", cluster
    )
    assert cluster.wait_for_run("article_pipeline", run_id, timeout=240) == "success"
    runs = cluster.query(
        "SELECT run_id, conf FROM dag_run WHERE dag_id = 'article_pipeline' AND run_id = :run_id",
        run_id=run_id,
    )
    assert len(runs) == 1
    row = next(r for r in Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows if r.token == token)
    assert row.get("run_id") == run_id and row.get("claim_token") == token
    # the ledger saw the same story: registered by the reconciler, leased and completed by the run
    engine = create_ledger_engine(ledger_url)
    try:
        ledger = Ledger(engine)
        key = ledger_link.work_key(row_key(normalise_url(url)))
        assert ledger.item(key).state == "done"
        assert [(h.event, h.actor) for h in ledger.history(key)] == [
            ("create", "reconciler"),
            ("claim", "worker"),
            ("complete", "worker"),
        ]
        [result] = ledger.results(key)
        assert result.payload["run_id"] == run_id and result.fencing_token == 1
    finally:
        engine.dispose()
