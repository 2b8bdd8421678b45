"""Outbox delivery is at least once (issue 11 defect 6), proven with a real killed worker.

An Asset event the relay hands to its task's outlet is recorded by Airflow when the task
succeeds; only then is its outbox row marked relayed (the operator's success callback). Here the
relaying task runs in its own process (``dag.test()`` against the session's metadata DB), Airflow
records the event, and the process is SIGKILLed before the row is marked: a user success
callback that runs first stands in for a slow notification. The row must still be pending, the
next pass must deliver the event again under the same event id, and a consumer that
deduplicates by that id sees it once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from onceflow.ledger import FollowUp, Ledger, create_ledger_engine
from onceflow.ledger.outbox import EVENT_ID_KEY, pending_rows, unique_events

ASSET = "file:///onceflow-outbox-crash/published"

RELAY_DAG = textwrap.dedent(
    """
    import os
    import pathlib
    import time

    from airflow.sdk import DAG

    from onceflow.operators.ledger import OutboxRelayOperator
    from onceflow.testing.dag_runner import run_dag

    def slow_notification(context):
        pathlib.Path(os.environ["ONCEFLOW_TEST_MARKER"]).write_text("task succeeded")
        time.sleep(600)  # the worker is killed here, before the outbox rows are confirmed

    with DAG("outbox_crash_relay", schedule=None, catchup=False) as dag:
        OutboxRelayOperator(task_id="relay", on_success_callback=slow_notification)

    run_dag(dag)
    """
)


@pytest.fixture
def ledger_conn(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": url}})
    )
    engine = create_ledger_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def asset_dag(run_dag):
    """A DAG with the asset as its outlet; running it once registers the asset in Airflow."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Asset

    with DAG("outbox_crash_asset_owner", schedule=None, catchup=False) as dag:
        EmptyOperator(task_id="noop", outlets=[Asset(ASSET)])
    assert run_dag(dag).state == "success"


def recorded_events():
    """Airflow's recorded events of the asset that carry an outbox event id."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == ASSET)
        ).all()
        return [dict(r.extra or {}) for r in rows if EVENT_ID_KEY in (r.extra or {})]


def wait_for(predicate, what, timeout=240.0):
    deadline = time.monotonic() + timeout  # generous: the machine is shared
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_worker_killed_after_airflow_recorded_the_event_leaves_the_row_pending_and_it_is_redelivered(
    run_dag, asset_dag, ledger_conn, tmp_path
):
    ledger = Ledger(ledger_conn)
    ledger.add("article", "a:1")
    ledger.commit_result(
        ledger.claim("article", "w", 60, "v1"), "publish", {}, follow_ups=[FollowUp.asset_event(ASSET)]
    )
    (row,) = pending_rows(ledger)

    dag_file, marker = tmp_path / "relay_dag.py", tmp_path / "succeeded"
    dag_file.write_text(RELAY_DAG)
    worker = subprocess.Popen(
        [sys.executable, str(dag_file)],
        env={**os.environ, "ONCEFLOW_TEST_MARKER": str(marker)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: marker.exists() or worker.poll() is not None, "the relay task to succeed")
        assert worker.poll() is None, f"the relay process exited early ({worker.returncode})"
        assert [e[EVENT_ID_KEY] for e in recorded_events()] == [row.dedup_key]  # durable in Airflow
        os.killpg(worker.pid, signal.SIGKILL)  # between delivery and marking
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=60)

    assert [r.dedup_key for r in pending_rows(ledger)] == [row.dedup_key], "marked relayed before durable"

    from airflow.sdk import DAG

    from onceflow.operators.ledger import OutboxRelayOperator

    with DAG("outbox_crash_relay_again", schedule=None, catchup=False) as again:
        OutboxRelayOperator(task_id="relay")
    result = run_dag(again)
    assert result.ti_states == {"relay": "success"} and result.xcom("relay")["relayed"] == 1
    assert pending_rows(ledger) == []  # confirmed by the success callback this time

    events = recorded_events()
    assert [e[EVENT_ID_KEY] for e in events] == [row.dedup_key, row.dedup_key]  # at least once
    assert len(unique_events(events, lambda extra: extra)) == 1  # once for a deduplicating consumer
