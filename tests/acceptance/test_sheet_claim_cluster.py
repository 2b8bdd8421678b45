"""The sheet queue through a real Airflow: api-server, scheduler (LocalExecutor), dag-processor, triggerer.

* Twenty deferrable ``NewRowsSensor`` tasks waiting on a 10-slot pool do not stop processing tasks
  in that pool from running (the seed's "sensor deadlock"): waiting happens in the triggerer.
* The real ``claim_rows`` task killed with SIGKILL between its claim and the run creation:
  ``sheet_reconcile`` creates the missing ``article_pipeline`` run, the scheduler runs it, and the
  row ends with exactly one run, whose id is written beside the claim, and DONE through the chain.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.sheets import ledger_link
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.transport import anonymous_service
from onceflow.testing.article_site import serve

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

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
    # Nothing the cluster runs answers from outside this machine: the api-server and the
    # scheduler's and triggerer's log servers (Airflow's bind every interface) listen on loopback.
    listeners = cluster.listeners()
    log_servers = {pid for pid, command, _ip, _port in listeners if "serve-logs" in command}
    assert len(log_servers) >= 2 and any("api_server" in c for _p, c, _i, _po in listeners), listeners
    assert all(ipaddress.ip_address(ip).is_loopback for _pid, _cmd, ip, _port in listeners), listeners
    # and the sensors do fire once there is work
    service = anonymous_service(sheets_emulator.endpoint)
    service.spreadsheets().values().append(
        spreadsheetId=sid,
        range="queue",
        valueInputOption="RAW",
        body={"values": [["https://a.example/new", "NEW"]]},
    ).execute()
    assert cluster.wait_for_run("sheet_sensor_wall", wall, timeout=240) == "success"


def _claimed_token(emulator: SheetsEmulator, sid: str, url: str) -> str | None:
    rows = Snapshot.from_values(emulator.values(sid, "queue")).rows
    return next((r.token for r in rows if r.get("url") == url and r.token), None)


def _ledger_lock_waiters(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sheet_reconcile_completes_a_row_whose_claim_task_was_killed_between_claim_and_run(
    airflow_cluster_factory: Any,
    sheets_emulator: SheetsEmulator,
    postgres_url_factory: Any,
    tmp_path: Path,
) -> None:
    """kill -9 of the real ``claim_rows`` task (``SheetClaimOperator`` under the scheduler) after
    its claim landed in the sheet and before it created the run; ``sheet_reconcile`` then creates
    the one missing run, the scheduler runs it, and the ledger tells the same story.

    Nothing is mocked. The task is held between its two steps by a lock: the operator's next step
    after the sheet claim is registering the row in the ledger (PostgreSQL), and the test holds
    ``work_items`` in ACCESS EXCLUSIVE mode, so the task waits there until it is killed.
    """
    site = serve(published_dir=tmp_path / "published")  # the run goes through the whole chain
    url = site.url("/articles/gazpacho.html")
    sid = _sheet(sheets_emulator, [[url, "NEW"]])
    conn = sheets_emulator.connection_json(spreadsheet_id=sid)
    key = row_key(normalise_url(url))
    run_id = pipeline_run_id(key, "v1")

    ledger_url = postgres_url_factory("ledger")
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)  # migrates: the table the test locks exists before any task runs
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("sheet_claim.py", "article_pipeline.py", "sheet_reconcile.py"):
        shutil.copy(REPO_DAGS / name, dags / name)
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": conn,
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": json.dumps(
            {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
        ),
        "AIRFLOW_CONN_ONCEFLOW_FETCH": json.dumps(
            {"conn_type": "generic", "extra": {"allow": [site.address]}}
        ),
        "AIRFLOW_CONN_ONCEFLOW_STORAGE": json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"base": (tmp_path / "steps").as_uri()}}
        ),
    }
    pools = {"onceflow_sheets": 10, "onceflow_fetch": 4, "onceflow_translate": 2}
    try:
        with engine.connect() as blocker:
            blocker.execute(text("LOCK TABLE work_items IN ACCESS EXCLUSIVE MODE"))
            # sheet_claim is not paused at creation: its first scheduled run claims the row
            cluster = airflow_cluster_factory(dags_folder=dags, env=env, pools=pools)
            _wait(lambda: _claimed_token(sheets_emulator, sid, url), 300, "the row claimed", cluster)
            token = _claimed_token(sheets_emulator, sid, url)
            assert token is not None
            running: list[dict[str, Any]] = []

            def claim_task_waits_on_the_ledger() -> bool:
                running[:] = cluster.query(
                    "SELECT run_id, pid, try_number FROM task_instance WHERE dag_id = 'sheet_claim' "
                    "AND task_id = 'claim_rows' AND state = 'running' AND pid IS NOT NULL"
                )
                return len(running) == 1 and _ledger_lock_waiters(engine) > 0

            _wait(claim_task_waits_on_the_ledger, 120, "claim_rows blocked on the ledger", cluster)
            [claimer] = running
            assert cluster.run_state("article_pipeline", run_id) is None, "the run came before the kill"
            os.kill(claimer["pid"], signal.SIGKILL)
            _wait(lambda: not _alive(claimer["pid"]), 30, "the claim task gone", cluster)
            blocker.rollback()  # releases the lock

        # The retry claims nothing (the row is PROCESSING, not NEW): the claim is orphaned.
        assert cluster.wait_for_run("sheet_claim", claimer["run_id"], timeout=240) == "success"
        attempts = cluster.query(
            "SELECT try_number, state FROM task_instance_history WHERE dag_id = 'sheet_claim' "
            "AND task_id = 'claim_rows' AND run_id = :run_id",
            run_id=claimer["run_id"],
        )
        # the killed attempt did not succeed (recorded failed, or up_for_retry as the retry began)
        killed = [a["state"] for a in attempts if a["try_number"] == claimer["try_number"]]
        assert len(killed) == 1 and killed[0] in {"failed", "up_for_retry"}, attempts
        assert cluster.dag_runs("article_pipeline") == []
        row = next(r for r in Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows if r.token)
        assert (row.get("url"), row.get("run_id")) == (url, "")

        params = {"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}
        first = cluster.trigger("sheet_reconcile", conf=params)
        assert cluster.wait_for_run("sheet_reconcile", first, timeout=240) == "success"
        _wait(
            lambda: cluster.run_state("article_pipeline", run_id) is not None,
            60,
            "article run created",
            cluster,
        )
        assert cluster.wait_for_run("article_pipeline", run_id, timeout=600) == "success", (
            cluster.task_log_tails("article_pipeline")
        )
        second = cluster.trigger("sheet_reconcile", conf=params)
        assert cluster.wait_for_run("sheet_reconcile", second, timeout=240) == "success"
        assert [r["run_id"] for r in cluster.dag_runs("article_pipeline")] == [run_id]

        row = next(
            r for r in Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows if r.token == token
        )
        assert row.get("run_id") == run_id and row.get("claim_token") == token
        assert row.status is Status.DONE and row.get("published_url"), row
        # registered by a reconciler (the killed task never got there; sheet_reconcile's own scheduled
        # run may have done it first), leased and completed by the run's first step, then its chain
        item_key = ledger_link.work_key(key)
        assert ledger.item(item_key).state == "done"
        assert [(h.event, h.actor) for h in ledger.history(item_key)][:3] == [
            ("create", "reconciler"),
            ("claim", "worker"),
            ("complete", "worker"),
        ]
        [result] = [r for r in ledger.results(item_key) if r.step == ledger_link.CLAIM_STEP]
        assert result.payload["run_id"] == run_id and result.fencing_token == 1
    finally:
        engine.dispose()
        site.stop()
