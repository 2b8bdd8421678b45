"""The sheet queue and the work ledger together, through dag.test on the real DAGs.

Real parts: the Sheets emulator driven by google-api-python-client, the ledger on SQLite and on
PostgreSQL (``ledger_url``), Airflow's metadata DB. ``sheet_claim`` registers each claim as an
``article`` item, ``article_pipeline``'s step commits through the ledger, and ``sheet_reconcile``
brings sheet, ledger and Airflow back into agreement, recording each repair as a ledger transition
by the reconciler and an audit-tab entry.

One thing is a stand-in: the article chain's later steps (fetch, translate, ...) come in a later
issue, so where a test needs an item the ledger gave up on or sent back for correction, it leases
the item and reports that outcome itself, as such a step would.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.ledger.reconcile import expire_stale_leases
from onceflow.sheets import ledger_link, reconcile
from onceflow.sheets.keys import normalise_url, row_key
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.clock import FakeClock
from onceflow.testing.dag_runner import FIRST_STEP_ONLY

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.engine import Engine

    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
RECONCILE = {"lease_minutes": 60, "processing_version": "v1", "max_redrives": 3}


@pytest.fixture
def article_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """``onceflow_ledger`` pointed at a fresh ledger (SQLite file or PostgreSQL database)."""
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


@pytest.fixture
def sheet(sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A queue spreadsheet with ``rows``; returns its id and a SheetQueue on it."""

    def make(rows: list[list[str]]) -> tuple[str, SheetQueue]:
        sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *rows]})
        monkeypatch.setenv(
            "AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid)
        )
        transport = GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid)
        return sid, SheetQueue(transport, spread=1)

    return make


def key_of(url: str) -> str:
    return ledger_link.work_key(row_key(normalise_url(url)))


def _end_run(run_id: str, state: str) -> None:
    """Set an ``article_pipeline`` run's state in the metadata DB (``dag.test()`` does not run it)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(
            update(DagRun)
            .where(DagRun.dag_id == "article_pipeline", DagRun.run_id == run_id)
            .values(state=state)
        )


def urls(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"https://news.example/{tag}/{i}" for i in range(n)]


def history(ledger: Ledger, key: str) -> list[tuple[str, str]]:
    return [(h.event, h.actor) for h in ledger.history(key)]


def created_run_notes(run_ids: list[str]) -> dict[str, str | None]:
    """run id -> the note of that article_pipeline run, as the UI shows it."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(
            select(DagRun).where(DagRun.dag_id == "article_pipeline", DagRun.run_id.in_(run_ids))
        ).all()
        return {r.run_id: r.note for r in runs}


def test_sheet_claim_registers_each_claimed_row_as_a_pending_article_item(
    run_dag: Any, sheet: Any, article_ledger: Ledger, sheets_emulator: SheetsEmulator
) -> None:
    batch = urls(3)
    sid, _ = sheet([[u, "NEW"] for u in batch] + [["not a url", "NEW"]])
    first = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert first.state == "success", first.ti_states
    out = first.xcom("claim_rows")
    assert sorted(out["ledger_items_created"]) == sorted(key_of(u) for u in batch)
    tokens = {c["url"]: c["claim_token"] for c in out["claims"]}
    # each run's note names its row's URL: the runs list tells them apart (run ids are opaque keys)
    notes = created_run_notes([c["run_id"] for c in out["claims"]])
    assert len(notes) == 3
    for c in out["claims"]:
        url, where = str(notes[c["run_id"]]).split(" — ")
        assert url == c["url"] and re.fullmatch(r"claimed from row [2-4]", where)
    for url in batch:
        item = article_ledger.item(key_of(url))
        assert (item.kind, item.state, item.fencing_token) == ("article", "pending", 0)
        assert item.payload["claim_token"] == tokens[normalise_url(url)]
        assert item.payload["spreadsheet_id"] == sid
        assert history(article_ledger, key_of(url)) == [("create", "producer")]
    assert article_ledger.counts("article") == {"pending": 3}, "the INVALID row is not work"

    # the editor sets a claimed row back to NEW: it is claimed again, but the item is not re-made
    requeued = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows[0]
    anonymous_service(sheets_emulator.endpoint).spreadsheets().values().update(
        spreadsheetId=sid,
        range=f"queue!B{requeued.number}",
        valueInputOption="RAW",
        body={"values": [["NEW"]]},
    ).execute()
    again = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert again.state == "success", again.ti_states
    assert len(again.xcom("claim_rows")["claims"]) == 1
    assert again.xcom("claim_rows")["ledger_items_created"] == []
    assert article_ledger.counts("article") == {"pending": 3}
    assert history(article_ledger, key_of(requeued.url)) == [("create", "producer")]


def test_the_article_step_commits_through_the_ledger_and_a_second_run_of_it_repeats_nothing(
    run_dag: Any, sheet: Any, article_ledger: Ledger
) -> None:
    [url] = urls(1)
    sid, queue = sheet([[url, "NEW"]])
    claim = queue.claim(1).claims[0]
    run = run_dag(
        "article_pipeline", conf=claim.conf(sid, "queue", "v1"), mark_success_pattern=FIRST_STEP_ONLY
    )
    assert run.state == "success", run.ti_states
    key = key_of(url)
    item = article_ledger.item(key)
    assert (item.state, item.fencing_token) == ("done", 1)
    [result] = article_ledger.results(key)
    assert (result.step, result.processing_version, result.fencing_token) == ("read_claimed_row", "v1", 1)
    assert result.payload["run_id"] == run.run_id == queue.find(claim.token).get("run_id")
    assert result.committed_by.startswith(f"article_pipeline/{run.run_id}/")
    assert history(article_ledger, key) == [
        ("create", "producer"),
        ("claim", "worker"),
        ("complete", "worker"),
    ]


def test_a_row_edited_to_another_article_sends_the_item_to_needs_correction_without_retries(
    run_dag: Any, sheet: Any, article_ledger: Ledger
) -> None:
    original, other = urls(2)
    sid, queue = sheet([[original, "NEW"]])
    claim = queue.claim(1).claims[0]
    queue.write_fields(claim.token, {"url": other})  # the editor pastes another link into the row
    run = run_dag(
        "article_pipeline", conf=claim.conf(sid, "queue", "v1"), mark_success_pattern=FIRST_STEP_ONLY
    )
    assert run.state == "failed"
    assert run.try_numbers["read_claimed_row"] == 1, "invalid input is not retried"
    item = article_ledger.item(key_of(original))
    assert item.state == "needs_correction"
    assert "is not the article this run was created for" in (item.last_error or "")
    assert history(article_ledger, key_of(original))[-1] == ("invalid_input", "worker")


@pytest.mark.parametrize(
    ("outcome", "status"), [("needs_correction", Status.INVALID), ("failed", Status.FAILED)]
)
def test_reconcile_settles_the_row_from_the_ledger_verdict_once(
    run_dag: Any,
    sheet: Any,
    article_ledger: Ledger,
    sheets_emulator: SheetsEmulator,
    outcome: str,
    status: Status,
) -> None:
    [url] = urls(1)
    sid, _ = sheet([[url, "NEW"]])
    claimed = run_dag("sheet_claim", conf={"max_rows": 5, "processing_version": "v1"})
    assert claimed.state == "success"
    key = key_of(url)
    # the row is settled only once no run is active (a queued run may still settle it); dag.test()
    # does not execute the run sheet_claim created, so its end is set in the metadata DB, as the
    # scheduler would record it. (This test used to pass with the run still queued only because
    # sheet_reconcile compared the Task SDK's DagRunState enum by str(): no state ever matched.)
    [run_id] = claimed.xcom("claim_rows")["runs"]
    _end_run(run_id, "failed")
    # stand-in for a later chain step (see the module docstring)
    lease = article_ledger.lease_key("article", key, "fetch-step", 60, "v1", reopen_reason="-")
    if outcome == "needs_correction":
        why = "page is not an article (no <article> element)"
        article_ledger.mark_invalid(lease, why)
    else:
        why = "TimeoutError: fetch timed out"
        while article_ledger.fail(lease, TimeoutError("fetch timed out"), backoff_seconds=0) != "failed":
            lease = article_ledger.lease_key("article", key, "fetch-step", 60, "v1", reopen_reason="-")
    assert article_ledger.item(key).state == outcome

    first = run_dag("sheet_reconcile", conf=RECONCILE)
    assert first.state == "success", first.ti_states
    [entry] = first.xcom("reconcile")
    assert entry["action"] == "transition" and why in entry["reason"]
    [row] = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows
    assert row.status is status and row.get("reason") == why
    assert run_dag("sheet_reconcile", conf=RECONCILE).xcom("reconcile") == [], "settled once"


def test_reconcile_registers_abandons_and_records_from_the_sheet_as_reconciler_transitions(
    run_dag: Any, sheet: Any, article_ledger: Ledger
) -> None:
    missed, given_up, published = urls(3)
    _, queue = sheet([[u, "NEW"] for u in (missed, given_up, published)])
    claims = {c.url: c for c in queue.claim(3).claims}  # claimed outside sheet_claim: no items yet
    for url in (given_up, published):
        article_ledger.add("article", key_of(url), reason="registered by the claimer")
    queue.transition(claims[normalise_url(given_up)].token, Status.PROCESSING, Status.FAILED)
    done = claims[normalise_url(published)].token
    queue.write_fields(done, {"published_url": "https://pub.example/p1"})
    queue.transition(done, Status.PROCESSING, Status.DONE)

    first = run_dag("sheet_reconcile", conf=RECONCILE)
    assert first.state == "success", first.ti_states
    assert sorted(e["action"] for e in first.xcom("reconcile")) == [
        "ledger_abandon",
        "ledger_record_done",
        "ledger_register",
    ]
    assert history(article_ledger, key_of(missed)) == [("create", "reconciler")]
    assert article_ledger.item(key_of(given_up)).state == "failed"
    assert history(article_ledger, key_of(given_up))[-1] == ("abandon", "reconciler")
    assert article_ledger.item(key_of(published)).state == "done"
    [result] = article_ledger.results(key_of(published))
    assert (result.step, result.payload) == (
        "sheet_done",
        {"published_url": "https://pub.example/p1", "source": "sheet"},
    )
    assert history(article_ledger, key_of(published))[-1] == ("record_result", "reconciler")
    audit = {e["action"] for e in queue.read_audit()}
    assert {"ledger_register", "ledger_abandon", "ledger_record_done"} <= audit

    before = {k: history(article_ledger, k) for k in map(key_of, (missed, given_up, published))}
    second = run_dag("sheet_reconcile", conf=RECONCILE)
    assert second.state == "success" and second.xcom("reconcile") == [], "repairs are idempotent"
    assert {k: history(article_ledger, k) for k in before} == before


class RacingLedger(Ledger):
    """The ledger as ``sheet_reconcile`` sees it, with another process acting right after a read.

    ``races[key]`` runs once, just after the first read of ``key``: the reader holds what it read
    while the other process moves the item on, as ``ledger_reconcile`` (same schedule) or a worker
    may between the sheet reconciler's read of an item and its transition.
    """

    def __init__(self, engine: Engine, races: dict[str, Callable[[], object]]) -> None:
        super().__init__(engine, migrate=False)
        self.races = races

    def item(self, work_key: str) -> Any:
        seen = super().item(work_key)
        race = self.races.pop(work_key, None)
        if race is not None:
            race()
        return seen


def test_reconcile_takes_a_ledger_item_moved_on_meanwhile_as_repaired_and_audits_what_it_did(
    sheet: Any, article_ledger: Ledger
) -> None:
    redriven, expired_meanwhile, taken_meanwhile = urls(3)
    _, queue = sheet([[u, "NEW"] for u in (redriven, expired_meanwhile, taken_meanwhile)])
    claims = {c.url: c for c in queue.claim(3).claims}
    article_ledger.add("article", key_of(redriven), reason="registered by the claimer")
    an_hour_ago = Ledger(article_ledger.engine, clock=FakeClock(start=time.time() - 3600), migrate=False)
    for url in (expired_meanwhile, taken_meanwhile):  # a worker leased them and died: lease expired
        an_hour_ago.lease_key("article", key_of(url), "dead-worker", 60, "v1", reopen_reason="-")
        queue.transition(claims[normalise_url(url)].token, Status.PROCESSING, Status.FAILED)
    now = datetime.now(timezone.utc)
    run_of = {c.token: c.run_id for c in claims.values()}
    plan = reconcile.plan(
        queue.snapshot(),
        now=now,
        lease=timedelta(0),
        version="v1",
        run_state={run_of[claims[normalise_url(redriven)].token]: "failed"}.get,
        audit=queue.read_audit(),
        ledger=lambda row_key: ledger_link.ledger_view(article_ledger, row_key),
    )
    assert [(a.kind, a.row.url) for a in plan.actions] == [
        ("reset_run", normalise_url(redriven)),
        ("ledger_abandon", normalise_url(expired_meanwhile)),
        ("ledger_abandon", normalise_url(taken_meanwhile)),
    ]

    # between the sheet reconciler's read of each item and its transition: ledger_reconcile
    # expires both leases (its own pass), then a worker leases the second item again
    def worker_takes_it() -> None:
        article_ledger.lease_key("article", key_of(taken_meanwhile), "worker-2", 600, "v1", reopen_reason="-")

    racing = RacingLedger(
        article_ledger.engine,
        {
            key_of(expired_meanwhile): lambda: expire_stale_leases(article_ledger),
            key_of(taken_meanwhile): worker_takes_it,
        },
    )
    created: list[tuple[str, bool]] = []

    def create_run(run_id: str, conf: dict[str, str], reset: bool) -> str:
        created.append((run_id, reset))
        return "created"

    entries = reconcile.apply(
        plan.actions,
        queue,
        now=now,
        create_run=create_run,
        ledger_repair=lambda action, conf: ledger_link.repair(
            racing, action.kind, conf=conf, row_number=action.row.number, reason=action.reason
        ),
    )
    assert not racing.races, "both races ran"
    assert created == [(run_of[claims[normalise_url(redriven)].token], True)]
    assert [(e["action"], e["url"]) for e in entries] == [
        ("reset_run", normalise_url(redriven)),
        ("ledger_abandon", normalise_url(expired_meanwhile)),
    ]
    # the expiry ledger_reconcile made stands for ours (once); the abandon is the reconciler's
    assert article_ledger.item(key_of(expired_meanwhile)).state == "failed"
    assert history(article_ledger, key_of(expired_meanwhile))[-2:] == [
        ("expire", "reconciler"),
        ("abandon", "reconciler"),
    ]
    assert [e for e, _ in history(article_ledger, key_of(expired_meanwhile))].count("expire") == 1
    # the item a worker took over is the worker's: not abandoned, not audited
    taken = article_ledger.item(key_of(taken_meanwhile))
    assert (taken.state, taken.lease_owner) == ("leased", "worker-2")
    assert queue.read_audit() == entries
