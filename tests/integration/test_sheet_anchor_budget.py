"""Row anchors stay bounded by the rows in flight, under Google's developer metadata cap.

Google caps developer metadata at 30,000 characters per spreadsheet and per sheet; the emulator
enforces the same cap (its default) with Google's 400. Each claim anchors its row; the anchor goes
in the batch of the row's final transition, so a queue can claim and finish any number of rows.
Real google-api-python-client against the emulator over HTTP throughout.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.retry import Backoff
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.wakeup import wake_up
from onceflow.testing.sheet_races import published_url
from onceflow.testing.sheets_emulator.limits import METADATA_LIMIT

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


def _queue(emulator: SheetsEmulator, sid: str) -> SheetQueue:
    transport = GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)
    return SheetQueue(transport, backoff=Backoff(base=0.05, cap=1.0), rng=random.Random(3))


def _anchors(emulator: SheetsEmulator, sid: str) -> list[Any]:
    book = emulator.server.store.spreadsheets[sid]
    return [m for m in book.all_metadata() if m.key == CLAIM_KEY]


def _in_flight(emulator: SheetsEmulator, sid: str) -> set[str]:
    snapshot = Snapshot.from_values(emulator.values(sid, "queue"))
    return {r.token for r in snapshot.rows if r.status is Status.PROCESSING and r.token}


# 1,500 rows already claim twice what 30,000 characters of anchors hold at once; the emulator
# rewrites every row per write, so 5,000 cost about 2.5 minutes: in make test-slow
@pytest.mark.parametrize("n", [1500, pytest.param(5000, marks=pytest.mark.slow)])
def test_rows_claimed_and_finished_under_the_metadata_cap(
    sheets_emulator_factory: Any, sqlite_ledger: Ledger, n: int
) -> None:
    emulator = sheets_emulator_factory(state=None)  # no state file: n rows rewritten per write
    assert emulator.server.store.metadata_limit == METADATA_LIMIT == 30_000
    rows = []
    for i in range(n):
        if i % 100 == 7:
            rows.append([f"ftp://bad.example.com/{i}", "NEW"])  # INVALID
        elif i % 100 == 8:
            rows.append([f"https://news.example.com/story/{i - 2}", "NEW"])  # DUPLICATE of a row above
        else:
            rows.append([f"https://news.example.com/story/{i}", "NEW"])
    sid = emulator.create_spreadsheet(
        "articles",
        sheets={"queue": [HEADER, *rows]},
    )
    queue = _queue(emulator, sid)
    held: list[str] = []  # the last rounds' claims stay in flight
    claimed = rejected = 0
    while True:
        woke = wake_up(queue, sqlite_ledger, 100)  # INVALID and DUPLICATE leave through the outbox
        result = woke.claim
        if result.aimed == 0:
            break
        claimed += len(result.claims)
        rejected += len(result.rejected)
        assert sorted(woke.rejected.written) == sorted(r.token for r in result.rejected)
        finishing = [c for c in result.claims if claimed < n - 200 or c.row_number % 2]
        held += [c.token for c in result.claims if c not in finishing]
        moved = queue.finish_many(
            [(c.token, Status.DONE, {"published_url": published_url(c.url)}) for c in finishing]
        )
        assert all(moved)
        # never more anchors than rows in flight, whatever has been claimed so far
        assert len(_anchors(emulator, sid)) == len(held)
    assert claimed + rejected == n and rejected == n // 50
    assert claimed > 731, "more rows than 30,000 characters of anchors could ever hold at once"
    left = _anchors(emulator, sid)
    assert {m.value for m in left} == set(held) == _in_flight(emulator, sid) and held
    assert sum(len(m.key) + len(m.value) for m in left) <= len(held) * (len(CLAIM_KEY) + max(map(len, held)))
    snapshot = Snapshot.from_values(emulator.values(sid, "queue"))
    done = [r for r in snapshot.rows if r.status is Status.DONE]
    assert len(done) == n - n // 50 - len(held)
    assert all(r.get("published_url") == published_url(r.url) for r in done)
    assert {r.status for r in snapshot.rows if r.url.startswith("ftp:")} == {Status.INVALID}


def test_a_final_transition_removes_the_anchor_and_keeps_other_rows_anchors(
    sheets_emulator: SheetsEmulator,
) -> None:
    urls = [f"https://news.example.com/{i}" for i in range(4)]
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    queue = _queue(sheets_emulator, sid)
    claims = queue.claim(4).claims
    assert len(_anchors(sheets_emulator, sid)) == 4
    sheets_emulator.request_log.reset()
    assert queue.finish(claims[0].token, Status.FAILED, {"reason": "gave up"})
    # 1 read (the tab with its rows' anchors) + 1 write (reason) + 1 batchUpdate (status + anchor)
    assert sheets_emulator.request_log.counts == {
        "spreadsheets.get": 1,
        "values.batchUpdateByDataFilter": 1,
        "spreadsheets.batchUpdate": 1,
    }
    assert {m.value for m in _anchors(sheets_emulator, sid)} == {c.token for c in claims[1:]}
    row = queue.find(claims[0].token)
    assert row is not None and row.status is Status.FAILED and row.get("reason") == "gave up"
    # fenced: a second finish changes nothing and writes no reason over the first
    assert not queue.finish(claims[0].token, Status.DONE, {"reason": "other"})
    row = queue.find(claims[0].token)
    assert row is not None and row.status is Status.FAILED and row.get("reason") == "gave up"


def test_the_sweep_removes_anchors_of_rows_finished_by_hand_only(sheets_emulator: SheetsEmulator) -> None:
    urls = [f"https://news.example.com/{i}" for i in range(6)]
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    queue = _queue(sheets_emulator, sid)
    claims = queue.claim(6).claims
    # an editor (or an older onceflow) finishes two rows without touching their anchors
    assert queue.transition(claims[0].token, Status.PROCESSING, Status.DONE)
    assert queue.transition(claims[1].token, Status.PROCESSING, Status.FAILED)
    assert len(_anchors(sheets_emulator, sid)) == 6
    assert queue.sweep_anchors() == 2
    assert {m.value for m in _anchors(sheets_emulator, sid)} == {c.token for c in claims[2:]}
    assert queue.sweep_anchors() == 0


def test_a_claim_refused_for_the_metadata_cap_sweeps_and_claims(sheets_emulator: SheetsEmulator) -> None:
    urls = [f"https://news.example.com/{i}" for i in range(40)]
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    queue = _queue(sheets_emulator, sid)
    first = queue.claim(10).claims
    size = len(CLAIM_KEY) + len(first[0].token)
    sheets_emulator.set_metadata_limit(size * 15)  # room for 15 anchors
    for c in first:  # finished by hand: anchors stay until swept
        assert queue.transition(c.token, Status.PROCESSING, Status.DONE)
    # 20 anchors would not fit: refused, swept, claimed (the sweep's retry is not one of the tries)
    won = queue.claim(10, attempts=1).claims
    assert len(won) == 10
    assert {m.value for m in _anchors(sheets_emulator, sid)} == {c.token for c in won}
    # nothing to sweep, room for 5: the claim takes what fits (10 refused, then 5)
    more = queue.claim(10).claims
    assert len(more) == 5
    # full: the 400 reaches the caller and says what to do
    import pytest

    from onceflow.sheets.retry import Refused

    with pytest.raises(Refused, match="every row anchor belongs to a row in flight"):
        queue.claim(10)
    assert {m.value for m in _anchors(sheets_emulator, sid)} == {c.token for c in won + more}


def test_reconcile_gives_up_on_a_row_and_its_anchor_goes_in_the_same_batch(
    sheets_emulator: SheetsEmulator,
) -> None:
    from datetime import datetime, timezone

    from onceflow.sheets import reconcile as rec

    urls = [f"https://news.example.com/{i}" for i in range(3)]
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    queue = _queue(sheets_emulator, sid)
    claims = queue.claim(3).claims
    row = queue.find(claims[0].token)
    assert row is not None
    give_up = rec.Action(
        "transition", "gave up", row, claims[0].run_id, Status.FAILED, (("reason", "gave up"),)
    )

    def no_runs(run_id: str, conf: dict[str, str], reset: bool) -> str:
        raise AssertionError("no run is created for a transition")

    sheets_emulator.request_log.reset()
    entries = rec.apply([give_up], queue, now=datetime.now(timezone.utc), create_run=no_runs)
    assert [e["action"] for e in entries] == ["transition"]
    # the reason through the anchor (1 read + 1 write), then the status and the anchor's deletion
    # in one batchUpdate, then the audit tab (addSheet + header + entry; tab ids left out)
    counts = {k: n for k, n in sheets_emulator.request_log.counts.items() if k != "spreadsheets.get"}
    assert counts == {
        "values.batchUpdateByDataFilter": 1,
        "spreadsheets.batchUpdate": 2,
        "values.append": 2,
    }
    row = queue.find(claims[0].token)
    assert row is not None and row.status is Status.FAILED and row.get("reason") == "gave up"
    assert {m.value for m in _anchors(sheets_emulator, sid)} == {c.token for c in claims[1:]}


def test_the_sweep_releases_anchors_of_rows_whose_run_is_over(sheets_emulator: SheetsEmulator) -> None:
    # until the article chain finishes rows, a row stays PROCESSING after its run succeeded;
    # sheet_reconcile passes such rows as released, or their anchors would fill the cap
    urls = [f"https://news.example.com/{i}" for i in range(3)]
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    queue = _queue(sheets_emulator, sid)
    claims = queue.claim(3).claims
    assert queue.sweep_anchors(released=[claims[0].token]) == 1
    assert {m.value for m in _anchors(sheets_emulator, sid)} == {c.token for c in claims[1:]}
    # a later write to the released row (a recheck's) still lands: it adopts a fresh anchor
    row = queue.write_fields(claims[0].token, {"score": "0.7"})
    assert row.get("score") == "0.7" and row.status is Status.PROCESSING


def test_reconcile_releases_a_succeeded_rows_anchor_on_every_pass_not_only_the_first(
    run_dag: Any, sheets_emulator: SheetsEmulator, monkeypatch: Any
) -> None:
    # The "run succeeded but the row is still PROCESSING" flag is written once, but the row's
    # anchor must be released on every pass: a recheck's write adopts a fresh anchor after the
    # first release, and a pass killed between its audit append and its sweep releases nothing.
    # Released only with the flag, such anchors stayed for good and filled the cap again.
    import uuid

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import update

    from onceflow.sheets import reconcile as rec

    url = f"https://{uuid.uuid4().hex[:8]}.example.com/a"
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, [url, "NEW"]]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    claimed = run_dag("sheet_claim", conf={"max_rows": 1, "processing_version": "v1"})
    assert claimed.state == "success", claimed.ti_states
    ((token, run_id),) = [(c["claim_token"], c["run_id"]) for c in claimed.xcom("claim_rows")["claims"]]
    # dag.test() does not execute the runs it creates: the run's success is set in the metadata
    # DB, as the scheduler would once article_pipeline finished
    with create_session() as session:
        session.execute(
            update(DagRun)
            .where(DagRun.dag_id == "article_pipeline", DagRun.run_id == run_id)
            .values(state=DagRunState.SUCCESS)
        )
    lease_passed = {"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}

    first = run_dag("sheet_reconcile", conf=lease_passed)
    assert first.state == "success", first.ti_states
    assert [e["reason"] for e in first.xcom("reconcile") if e["action"] == "flag"].count(
        rec.SUCCESS_NOT_DONE
    ) == 1
    assert _anchors(sheets_emulator, sid) == []

    # a recheck writes to the row (it is still PROCESSING): it adopts a fresh anchor
    _queue(sheets_emulator, sid).write_fields(token, {"score": "0.7"})
    assert [m.value for m in _anchors(sheets_emulator, sid)] == [token]

    second = run_dag("sheet_reconcile", conf=lease_passed)
    assert second.state == "success", second.ti_states
    assert rec.SUCCESS_NOT_DONE not in [e["reason"] for e in second.xcom("reconcile")], "flagged twice"
    assert _anchors(sheets_emulator, sid) == [], "the adopted anchor of a row whose run is over stayed"
