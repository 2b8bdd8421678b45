"""A task Airflow stops hands its ledger lease back at once (real scheduler, LocalExecutor).

Each test holds a real task in the middle of its fenced step, with the item leased, then marks
the running task failed through Airflow's REST API, as a user does in the UI. The task's
supervisor learns it at its next heartbeat and sends the task SIGTERM, which calls the operator's
``on_kill``; five seconds later it sends SIGKILL. The lease must come back (``release``, reason
``HANDED_BACK``) in that window: read straight from the ledger database, the item is ``pending``
with no lease owner, released before the lease would have expired. Before the fix the item
stayed ``leased`` by the dead task until expiry, and a new run of the same step failed with
``LeaseHeld`` until then.

* ``read_claimed_row`` (``ClaimedRowOperator``, i.e. ``run_keyed_step``): held in its sheet write
  by the Sheets emulator's latency fault; ledger on SQLite.
* the partition load (``PartitionOverwriteOperator`` through ``load_partition``): held in its
  overwrite by a PostgreSQL lock the test takes on the sales table (SHARE: reads pass, writes
  wait), after the day's token was registered; ledger on PostgreSQL. After
  the hand-back, a new run of the same day loads it at once.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.ledger.errors import UnknownWorkItem
from onceflow.ledger.steps import HANDED_BACK
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.ledger_link import work_key_for
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.staging import write_clean
from onceflow.sheets import ledger_link
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = pytest.mark.real_airflow

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
LEASE_SECONDS = 300
DAY = dt.date(2024, 10, 27)

LOAD_DAG = '''
"""One partition load through the ledger, as daily_sales' load task does it."""
import pendulum
from airflow.sdk import dag

from onceflow.operators.partition import PartitionOverwriteOperator


@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
     tags=["test"], default_args={{"owner": "onceflow", "retries": 0}})
def load_one_day():
    PartitionOverwriteOperator(task_id="load", partition="{day}", staging_dir="{staging}",
                               table="daily_sales", lease_seconds={lease})


load_one_day()
'''


def poll(predicate: Any, timeout: float, what: str, cluster: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{cluster.log_tails()}")


def leased(ledger: Ledger, key: str) -> bool:
    try:
        return ledger.item(key).state == "leased"
    except UnknownWorkItem:
        return False


def mark_failed(cluster: Any, dag_id: str, run_id: str, task_id: str) -> None:
    """What the UI's "mark failed" does: PATCH the task instance through the REST API."""
    with urllib.request.urlopen(f"{cluster.api_url}/auth/token", timeout=30) as resp:  # all-admins mode
        token = json.load(resp)["access_token"]
    request = urllib.request.Request(
        f"{cluster.api_url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
        data=json.dumps({"new_state": "failed"}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200


def running_task(cluster: Any, dag_id: str, run_id: str) -> bool:
    return bool(
        cluster.query(
            "SELECT 1 FROM task_instance WHERE dag_id = :dag_id AND run_id = :run_id AND state = 'running'",
            dag_id=dag_id,
            run_id=run_id,
        )
    )


def assert_handed_back(ledger: Ledger, key: str, cluster: Any, expires_at: float) -> None:
    """The item is pending again, its lease released by the stopped task before it expired.

    Nothing else here could free it: no reconciler runs, so an expired lease would stay leased.
    """

    def released() -> bool:
        return ledger.item(key).state == "pending"

    poll(released, 90, f"{key}'s lease to be handed back (it stays leased until it expires)", cluster)
    item = ledger.item(key)
    assert (item.state, item.lease_expires_at, item.fencing_token) == ("pending", None, 1)
    claim, release = ledger.history(key)[-2:]
    assert (claim.event, release.event, release.actor) == ("claim", "release", "worker")
    assert release.reason == HANDED_BACK and release.owner == claim.owner
    assert release.at < expires_at, "handed back by the stopped task, not after expiry"


def test_marking_a_running_article_step_failed_hands_its_lease_back_at_once(
    airflow_cluster_factory: Any, sheets_emulator: SheetsEmulator, tmp_path: Path
) -> None:
    chain = f"article_pipeline_stop_{uuid.uuid4().hex[:8]}"
    url = f"https://stop.example/{uuid.uuid4().hex[:8]}"
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, [url, "NEW"]]})
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    [claim] = queue.claim(1).claims
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    conf = claim.conf(sid, "queue", "v1")
    ledger_link.register_claims(
        ledger, [ledger_link.ClaimRecord(claim.row_key, claim.row_number, claim.token, conf)]
    )
    key = ledger_link.work_key(claim.row_key)

    dags = tmp_path / "dags"
    dags.mkdir()
    source = (REPO_DAGS / "article_pipeline.py").read_text()
    (dags / f"{chain}.py").write_text(
        source.replace('CHAIN_DAG_ID = "article_pipeline"', f'CHAIN_DAG_ID = "{chain}"')
    )
    # the step's sheet write hangs (60 s) until Airflow stops the task
    hang = sheets_emulator.faults.add(
        "latency", latency=60, count=1, methods=["values.batchUpdateByDataFilter"]
    )
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": sheets_emulator.connection_json(spreadsheet_id=sid),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": json.dumps(
            {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
        ),
    }
    try:
        cluster = airflow_cluster_factory(dags_folder=dags, env=env, pools={"onceflow_sheets": 1})
        run_id = cluster.trigger(chain, conf=conf, run_id=claim.run_id)
        poll(
            lambda: (
                hang.fired == 1
                and ledger.item(key).state == "leased"
                and running_task(cluster, chain, run_id)
            ),
            240,
            "read_claimed_row to hang in its sheet write, the item leased",
            cluster,
        )
        expires_at = ledger.item(key).lease_expires_at
        mark_failed(cluster, chain, run_id, "read_claimed_row")
        assert_handed_back(ledger, key, cluster, expires_at)
        assert cluster.wait_for_run(chain, run_id, timeout=120) == "failed"
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_marking_a_running_partition_load_failed_hands_its_lease_back_and_the_day_loads_at_once(
    airflow_cluster_factory: Any, postgres_url_factory: Any, tmp_path: Path
) -> None:
    dag_id = f"load_stop_{uuid.uuid4().hex[:8]}"
    ledger_url, warehouse_url = postgres_url_factory("ledger"), postgres_url_factory("warehouse")
    ledger_engine = create_ledger_engine(ledger_url)
    ledger = Ledger(ledger_engine)
    warehouse = make_engine(warehouse_url)
    PartitionStore(warehouse, "daily_sales").create_schema()
    staging = tmp_path / "staging" / DAY.isoformat()
    write_clean(staging, clean_day(DAY, GeneratorConfig(seed=5, orders_per_day=40)), partition=DAY,
                processing_version=PROCESSING_VERSION)  # fmt: skip
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{dag_id}.py").write_text(
        textwrap.dedent(
            LOAD_DAG.format(dag_id=dag_id, day=DAY.isoformat(), staging=staging, lease=LEASE_SECONDS)
        )
    )
    env = {
        conn: json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}})
        for conn, url in (
            ("AIRFLOW_CONN_ONCEFLOW_LEDGER", ledger_url),
            ("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE", warehouse_url),
        )
    }
    key = work_key_for("daily_sales", DAY)

    def load_waits_in_its_overwrite(run_id: str) -> bool:
        with warehouse.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        return waiting > 0 and leased(ledger, key) and running_task(cluster, dag_id, run_id)

    try:
        cluster = airflow_cluster_factory(dags_folder=dags, env=env)
        with warehouse.connect() as blocker:
            # reads go on (the schema check), writes wait: the load waits in its overwrite
            blocker.execute(text("LOCK TABLE daily_sales IN SHARE MODE"))
            first = cluster.trigger(dag_id)
            poll(
                lambda: load_waits_in_its_overwrite(first),
                240,
                "the load to wait in its overwrite, the day leased",
                cluster,
            )
            expires_at = ledger.item(key).lease_expires_at
            mark_failed(cluster, dag_id, first, "load")
            assert_handed_back(ledger, key, cluster, expires_at)
            blocker.rollback()
        assert cluster.wait_for_run(dag_id, first, timeout=120) == "failed"

        # the next run need not wait for the stopped attempt's lease to expire
        second = cluster.trigger(dag_id)
        assert cluster.wait_for_run(dag_id, second, timeout=240) == "success", cluster.task_log_tails(dag_id)
        item = ledger.item(key)
        assert (item.state, item.fencing_token) == ("done", 2)
        [result] = ledger.results(key)
        assert result.fencing_token == 2 and result.payload["run_id"] == second
    finally:
        ledger_engine.dispose()
        warehouse.dispose()
        shutil.rmtree(tmp_path / "staging", ignore_errors=True)
