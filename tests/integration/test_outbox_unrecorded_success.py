"""An Asset event is marked relayed only if Airflow recorded it (review of issue 11 defect 6).

The relay hands an Asset event to its task's outlet; Airflow records it with the task's success
report. The success callback then marks the outbox row relayed. But Airflow runs the success
callbacks even when it did not take the report: a task instance the scheduler or a user moved
out of ``running`` meanwhile (heartbeat timeout, "mark failed", "mark success") gets a 409, or,
when it is already ``success``, a 200 that records nothing, and ``finalize()`` runs
``on_success_callback`` all the same. Here the relay task's instance is marked by another
session while it runs, through the metadata DB as a user's "mark success" / the scheduler's
heartbeat-timeout handling would; the event must then stay pending in the ledger (read back
with plain SQL) so the next pass delivers it.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from onceflow.ledger import FollowUp, Ledger, create_ledger_engine
from onceflow.ledger.outbox import EVENT_ID_KEY
from onceflow.operators.ledger import OutboxRelayOperator

ASSET = "file:///onceflow-outbox-unrecorded/published"


class MarkedWhileRunning(OutboxRelayOperator):
    """The relay, whose task instance another session moves to ``mark_as`` before it returns."""

    def __init__(self, *, mark_as: str, **kwargs):
        super().__init__(**kwargs)
        self.mark_as = mark_as

    def execute(self, context):
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        report = super().execute(context)
        ti = context["ti"]
        with create_session() as session:  # another actor: the scheduler, or a user in the UI
            session.execute(
                sa.update(TaskInstance)
                .where(TaskInstance.id == ti.id)
                .values(state=self.mark_as)
                .execution_options(synchronize_session=False)
            )
        return report


@pytest.fixture
def ledger_engine(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": url}})
    )
    engine = create_ledger_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def asset_dag(run_dag):
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Asset

    with DAG("outbox_unrecorded_asset_owner", schedule=None, catchup=False) as dag:
        EmptyOperator(task_id="noop", outlets=[Asset(ASSET)])
    assert run_dag(dag).state == "success"


def recorded_event_ids(work_key: str) -> list[str]:
    """Airflow's recorded events of the asset whose outbox event id names ``work_key``."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            sa.select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == ASSET)
        ).all()
        ids = [(r.extra or {}).get(EVENT_ID_KEY) for r in rows]
        return [i for i in ids if isinstance(i, str) and f":{work_key}:" in i]


@pytest.mark.parametrize("mark_as", ["success", "failed"])
def test_an_event_airflow_did_not_record_stays_pending(run_dag, asset_dag, ledger_engine, mark_as):
    from airflow.sdk import DAG

    ledger = Ledger(ledger_engine)
    work_key = f"a:{mark_as}"  # one event id per case: the metadata DB is shared by the session
    ledger.add("article", work_key)
    lease = ledger.claim("article", "w", 60, "v1")
    assert lease is not None
    ledger.commit_result(lease, "publish", {}, follow_ups=[FollowUp.asset_event(ASSET)])

    with DAG(f"outbox_unrecorded_relay_{mark_as}", schedule=None, catchup=False) as dag:
        MarkedWhileRunning(task_id="relay", mark_as=mark_as)
    run_dag(dag)

    assert recorded_event_ids(work_key) == []  # Airflow did not take the task's report: no event
    with ledger_engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT state FROM outbox").scalars().all()
    assert stored == ["pending"], "the row was marked relayed but Airflow never recorded its event"

    with DAG(f"outbox_unrecorded_relay_again_{mark_as}", schedule=None, catchup=False) as again:
        OutboxRelayOperator(task_id="relay")
    assert run_dag(again).ti_states == {"relay": "success"}
    with ledger_engine.connect() as conn:
        (key, state) = conn.exec_driver_sql("SELECT dedup_key, state FROM outbox").one()
    assert (recorded_event_ids(work_key), state) == ([key], "relayed")  # the next pass delivered it
