"""``sheet_claim`` choosing the batch lane (``batch_size``), and ``sheet_reconcile`` on its rows.

``sheet_claim`` and ``sheet_reconcile`` run with ``dag.test()`` against the Sheets emulator, the
ledger on PostgreSQL and the session's metadata DB (runs are created through the Task SDK as in
production; no scheduler executes them here, so a run's end is set in the metadata DB).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.sheets import ledger_link
from onceflow.sheets.keys import BATCH_RUN_KEY, normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot
from onceflow.testing.dag_runner import dag_runs

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = pytest.mark.postgres

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
RECONCILE = {"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}


@pytest.fixture
def article_ledger(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": postgres_url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
    engine = create_ledger_engine(postgres_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def queue_of(emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch, urls: list[str]) -> str:
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", emulator.connection_json(spreadsheet_id=sid))
    return sid


def key_of(url: str) -> str:
    return row_key(normalise_url(url))


def set_run_state(dag_id: str, run_id: str, state: str) -> None:
    """End a run in the metadata DB (``dag.test()`` of the claimer does not run it)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(
            update(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id).values(state=state)
        )


def test_a_batch_size_sends_new_articles_in_batches_and_a_second_claim_of_one_is_a_duplicate(
    run_dag: Any, article_ledger: Ledger, sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = uuid.uuid4().hex[:8]
    urls = [f"https://news.example/{tag}/{i}" for i in range(5)]
    sid = queue_of(sheets_emulator, monkeypatch, urls)

    claimed = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1", "batch_size": 2})

    assert claimed.state == "success", claimed.ti_states
    out = claimed.xcom("claim_rows")
    tokens = {c["url"]: c["claim_token"] for c in out["claims"]}
    # a JSON object's keys come back in any order (PostgreSQL's jsonb sorts them): the sheet's
    # order is that of the claims
    order = [c["claim_token"] for c in out["claims"]]
    batches = dict(sorted(out["batches"].items(), key=lambda kv: order.index(kv[1][0])))
    # in the sheet's order, two a batch; each run id from its first claim token
    assert [len(b) for b in batches.values()] == [2, 2, 1]
    assert [t for b in batches.values() for t in b] == order
    assert list(batches) == [f"batch__{b[0]}" for b in batches.values()]
    runs = dag_runs("article_batch")
    for run_id, members in batches.items():
        conf = runs[run_id][1]
        assert [c["claim_token"] for c in conf["claims"]] == members
        assert {c[BATCH_RUN_KEY] for c in conf["claims"]} == {run_id}
    # no per-article run; each item's payload names its batch (what sheet_reconcile follows)
    assert not {pipeline_run_id(key_of(u), "v1") for u in urls} & set(dag_runs("article_pipeline"))
    for url in urls:
        payload = article_ledger.item(ledger_link.work_key(key_of(url))).payload
        [batch] = [run_id for run_id, members in batches.items() if tokens[normalise_url(url)] in members]
        assert payload[BATCH_RUN_KEY] == batch

    # the editor sets a claimed row back to NEW: its second claim finds the article's item owned by
    # the batch under the first claim, and steps aside as DUPLICATE (no run, no batch)
    requeued = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows[0]
    from onceflow.sheets.transport import anonymous_service

    anonymous_service(sheets_emulator.endpoint).spreadsheets().values().update(
        spreadsheetId=sid,
        range=f"queue!B{requeued.number}",
        valueInputOption="RAW",
        body={"values": [["NEW"]]},
    ).execute()
    again = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1", "batch_size": 2})
    assert again.state == "success", again.ti_states
    second = again.xcom("claim_rows")
    assert second["batches"] == {}
    assert [d["owner_token"] for d in second["duplicates"]] == [tokens[normalise_url(requeued.url)]]
    assert len(dag_runs("article_batch")) == len(runs), "no batch run for the second claim"
    row = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows[0]
    assert row.status.value == "DUPLICATE", row


def test_reconcile_leaves_batch_rows_to_a_running_batch_and_re_drives_them_alone_once_it_failed(
    run_dag: Any, article_ledger: Ledger, sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = uuid.uuid4().hex[:8]
    urls = [f"https://news.example/{tag}/{i}" for i in range(3)]
    queue_of(sheets_emulator, monkeypatch, urls)
    claimed = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1", "batch_size": 10})
    [(batch, members)] = claimed.xcom("claim_rows")["batches"].items()
    assert len(members) == 3

    # the batch run is queued (a backlog, a review): past the lease, nothing is re-driven
    first = run_dag("sheet_reconcile", conf=RECONCILE)
    assert first.state == "success", first.ti_states
    mine = {pipeline_run_id(key_of(u), "v1") for u in urls}
    assert not mine & set(dag_runs("article_pipeline"))
    assert not [e for e in first.xcom("reconcile") if e["action"] == "create_run"]

    # the batch run failed before any row's outcome: each row gets its own article_pipeline run
    set_run_state("article_batch", batch, "failed")
    second = run_dag("sheet_reconcile", conf=RECONCILE)
    assert second.state == "success", second.ti_states
    created = [e for e in second.xcom("reconcile") if e["action"] == "create_run"]
    assert sorted(e["run_id"] for e in created) == sorted(mine)
    assert all(f"batch run {batch} ended failed" in e["reason"] for e in created), created
    assert mine <= set(dag_runs("article_pipeline"))
