"""The ledger's Airflow side against the real metadata DB: sinks, operators and both DAGs.

The ledger itself is a SQLite file named by the ``onceflow_ledger`` connection (an environment
variable), so the tasks open it exactly as they would in production.
"""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from onceflow.ledger import FollowUp, Ledger, create_ledger_engine
from onceflow.ledger.models import stable_run_id
from onceflow.ledger.outbox import OutboxRelay, pending_rows
from onceflow.testing.clock import FakeClock

TARGET_DAG = "ledger_test_chain"
TARGET_ASSET = "file:///onceflow-ledger-test/published"


@pytest.fixture
def chain_dag(run_dag):
    """A tiny DAG standing in for the chain; running it once registers it (and its asset)."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Asset

    with DAG(TARGET_DAG, schedule=None, catchup=False) as dag:
        EmptyOperator(task_id="noop", outlets=[Asset(TARGET_ASSET)])
    assert run_dag(dag).state == "success"
    return dag


@pytest.fixture
def ledger_conn(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": url}})
    )
    engine = create_ledger_engine(url)
    yield url, engine
    engine.dispose()


def dag_run_ids(dag_id):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return {dr.run_id: dr.conf for dr in DagRun.find(dag_id=dag_id, session=session)}


def asset_events(uri):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == uri)
        ).all()
        return [dict(r.extra or {}) for r in rows]


def test_the_metadata_db_sink_creates_each_run_once_and_records_asset_events(chain_dag, ledger_conn):
    from onceflow.hooks.ledger import MetadataDbSink

    _, engine = ledger_conn
    ledger = Ledger(engine)
    ledger.add("article", "a:1")
    lease = ledger.claim("article", "w", 60, "v1")
    ledger.commit_result(
        lease,
        "publish",
        {},
        follow_ups=[FollowUp.dag_run(TARGET_DAG, {"x": 1}), FollowUp.asset_event(TARGET_ASSET)],
    )
    sink = MetadataDbSink()
    report = OutboxRelay(ledger, sink).relay_once()
    assert report.relayed == 2 and report.errors == []
    run_id = stable_run_id("a:1", "publish", "v1", "t1")
    assert dag_run_ids(TARGET_DAG)[run_id] == {"x": 1, "onceflow_work_key": "a:1", "onceflow_step": "publish"}
    # (the chain DAG's own run emitted one event without our key)
    assert [e["onceflow_dedup_key"] for e in asset_events(TARGET_ASSET) if "onceflow_dedup_key" in e] == [
        f"asset_event:{TARGET_ASSET}:a:1:publish:v1:t1"
    ]
    # A crash between delivery and marking repeats the delivery: Airflow refuses the duplicate run.
    assert sink.trigger_dag_run(TARGET_DAG, run_id, {}) is False
    assert list(dag_run_ids(TARGET_DAG)).count(run_id) == 1


def test_the_recheck_dag_reopens_dispatches_and_relays_with_its_reason(run_dag, chain_dag, ledger_conn):
    _, engine = ledger_conn
    ledger = Ledger(engine)
    ledger.add_many("article", [f"art:{i}" for i in range(6)])
    for _ in range(6):
        ledger.commit_result(ledger.claim("article", "w", 60, "v1"), "publish", {"ok": True})

    result = run_dag(
        "recheck",
        conf={
            "scope": "quality_sample",
            "reason": "weekly QA sample",
            "kind": "article",
            "max_items": 3,
            "chain_dag_id": TARGET_DAG,
        },
    )
    assert result.ti_states == {"start": "success", "dispatch": "success", "relay": "success"}
    started = result.xcom("start")
    assert started["selected"] == 3
    assert sorted(result.xcom("dispatch")["completed"]) == sorted(started["work_keys"])
    assert result.xcom("relay")["relayed"] == 3

    runs = dag_run_ids(TARGET_DAG)
    for key in started["work_keys"]:
        run_id = stable_run_id(key, f"recheck{started['recheck_id']}", "v1")
        assert runs[run_id]["reason"] == "weekly QA sample"
        assert runs[run_id]["onceflow_lane"] == "recheck"
        assert [t.event for t in ledger.history(key)][-3:] == ["recheck", "claim", "complete"]
    from onceflow.ledger.recheck import recheck_report

    report = recheck_report(ledger, started["recheck_id"])
    assert report["reason"] == "weekly QA sample" and report["by_state"] == {"done": 3}
    assert pending_rows(ledger) == []


def test_the_recheck_dag_refuses_a_new_version_recheck_without_a_target_version(run_dag, ledger_conn):
    result = run_dag("recheck", conf={"scope": "new_version", "reason": "model v2", "kind": "article"})
    assert result.ti_states["start"] == "failed"


def test_the_reconcile_dag_expires_dead_leases_and_relays_a_stalled_outbox(run_dag, chain_dag, ledger_conn):
    _, engine = ledger_conn
    an_hour_ago = FakeClock(start=time.time() - 3600)
    past = Ledger(engine, clock=an_hour_ago)
    past.add("article", "dead:1")
    past.claim("article", "crashed-worker", 60, "v1")  # expired 59 minutes ago
    past.add("article", "done:1")
    past.commit_result(
        past.claim("article", "w", 60, "v1"), "publish", {}, follow_ups=[FollowUp.dag_run(TARGET_DAG)]
    )

    past.add("article", "ghost:1")  # relayed an hour ago, but the run is not in Airflow
    ghost = past.claim("article", "w", 60, "v1")
    past.commit_result(
        ghost, "publish", {}, follow_ups=[FollowUp.dag_run(TARGET_DAG, run_id="onceflow__ghost")]
    )
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE outbox SET state = 'relayed', relayed_at = :t WHERE work_key = 'ghost:1'"),
            {"t": an_hour_ago.now()},
        )

    result = run_dag("ledger_reconcile")
    assert result.ti_states == {"relay": "success", "reconcile": "success", "partition_results": "success"}
    ledger = Ledger(engine)
    assert ledger.item("dead:1").state == "pending"
    expire = ledger.history("dead:1")[-1]
    assert (expire.event, expire.actor) == ("expire", "reconciler")
    runs = dag_run_ids(TARGET_DAG)
    assert stable_run_id("done:1", "publish", "v1", "t1") in runs
    assert "onceflow__ghost" in runs
    assert [t.event for t in ledger.history("ghost:1")][-2:] == ["repair_follow_up", "repair_follow_up"]
    assert pending_rows(ledger) == []


def test_the_reconcile_dag_records_a_partition_load_the_ledger_missed(
    run_dag, ledger_conn, tmp_path, monkeypatch
):
    """A load committed in the warehouse and died before its ledger commit; ledger_reconcile
    records the result from load_audit (actor reconciler)."""
    import datetime as dt

    from onceflow.sales.clean import PROCESSING_VERSION
    from onceflow.sales.engine import make_engine
    from onceflow.sales.generator import GeneratorConfig
    from onceflow.sales.ledger_link import KIND, work_key_for
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.testing.sales_fixtures import clean_day

    warehouse = f"sqlite:///{tmp_path / 'warehouse.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE",
        json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": warehouse}}),
    )
    _, engine = ledger_conn
    ledger = Ledger(engine)
    store = PartitionStore(make_engine(warehouse), "daily_sales")
    store.create_schema()
    day = dt.date(2024, 6, 15)
    key = work_key_for("daily_sales", day)
    rows = clean_day(day, GeneratorConfig(seed=3, orders_per_day=20))
    lease = ledger.lease_key(KIND, key, "daily_sales/r/1", 3600, PROCESSING_VERSION, reopen_reason="x")
    wl = store.register_ledger_token(day, token=lease.token, work_key=key, run_id="r", try_number=1)
    audit = store.overwrite(wl, rows.rows, rows.rejects, processing_version=PROCESSING_VERSION)

    result = run_dag("ledger_reconcile")
    assert result.ti_states["partition_results"] == "success"
    assert [f["work_key"] for f in result.xcom("partition_results")] == [key]
    [stored] = ledger.results(key)
    assert (stored.committed_by, stored.fencing_token, stored.payload["checksum"]) == (
        "reconciler",
        1,
        audit.checksum,
    )
    assert ledger.item(key).state == "done"
    assert [(t.event, t.actor) for t in ledger.history(key)][-1] == ("record_result", "reconciler")
