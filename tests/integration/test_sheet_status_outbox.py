"""FAILED, NEEDS_REVIEW and REJECTED leave through the ledger's outbox, as DONE does (issue 22).

A permanent step failure commits the row's FAILED with the item's ``needs_correction``;
``mark_needs_review`` commits NEEDS_REVIEW with its result; a reviewer's rejection commits the
decision and REJECTED as the ledger step ``review``. :mod:`onceflow.sheets.relay` writes them.
Proven here, through the real operators' code (only the Airflow task context is a plain
namespace) against the Sheets emulator over HTTP and a real ledger:

* each status reaches the row in one relay pass (1 ``spreadsheets.get`` + 1 read + 2 writes),
  with its cells, NEEDS_REVIEW keeping the anchor and the final statuses removing it;
* a process SIGKILLed after those commits (before any relay) loses nothing, and a relaying
  process SIGKILLed after its sheet batch repeats nothing: no field written again, no anchor left
  on a final row; a REJECTED committed while its NEEDS_REVIEW still waited goes straight from
  PROCESSING;
* the status moves only while the row's URL is still the article's (the guard the DONE write has).

The stale try (issue 22, defect 4) is in ``test_article_stale_try.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.articles.errors import PermanentStepError
from onceflow.compat import AirflowFailException
from onceflow.hooks.sheets import SheetQueueHook
from onceflow.ledger import Ledger
from onceflow.ledger.db import create_ledger_engine
from onceflow.ledger.outbox import pending_sheet_rows
from onceflow.ledger.steps import run_keyed_step
from onceflow.operators.article_step import ArticleStepOperator
from onceflow.operators.articles import ArticleReviewOperator, MarkNeedsReviewOperator
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.ledger_link import work_key
from onceflow.sheets.model import Snapshot
from onceflow.sheets.relay import relay_sheet_rows
from onceflow.sheets.transport import anonymous_service
from onceflow.testing.sheet_edits import batch_update, set_row

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from onceflow.articles.chain import StepRun
    from onceflow.sheets.protocol import Claim
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
RUN = "manual__1"
ONE_PASS = {
    "spreadsheets.get": 1,
    "values.batchUpdateByDataFilter": 1,
    "spreadsheets.batchUpdate": 1,
}


@pytest.fixture
def article_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def _claimed(emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch, n: int) -> tuple[str, list[Claim]]:
    urls = [[f"https://news.example.com/status-{i}", "NEW"] for i in range(n)]
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *urls]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", emulator.connection_json(spreadsheet_id=sid))
    claims = SheetQueueHook(spreadsheet_id=sid).queue("v1", spread=1).claim(n).claims
    assert len(claims) == n
    return sid, sorted(claims, key=lambda c: c.row_number)


def _context(sid: str, claim: Claim, task_id: str) -> Any:
    ti = SimpleNamespace(dag_id="article_pipeline", run_id=RUN, try_number=1, task_id=task_id)
    return {"ti": ti, "dag_run": SimpleNamespace(conf=claim.conf(sid, "queue", "v1"))}


def _polished(ledger: Ledger, claim: Claim, value: float = 0.41) -> None:
    """``polish``'s result, committed by the run (what ``mark_needs_review`` and the review read)."""
    run_keyed_step(
        ledger, kind="article", work_key=work_key(claim.row_key), step="polish",
        owner=f"article_pipeline/{RUN}/1/polish", worker_version="v1",
        work=lambda _lease: {"value": value, "reasons": ["unknown words: huerto"], "parts": {"unknown": 0.4}},
    )  # fmt: skip


def _rows(emulator: SheetsEmulator, sid: str) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for row in Snapshot.from_values(emulator.values(sid, "queue")).rows:
        if row.token:
            assert row.token not in found, f"{row.token} is on two rows"
            found[row.token] = {name: row.get(name) for name in HEADER}
    return found


def _anchors(emulator: SheetsEmulator, sid: str) -> set[str]:
    return {
        str(m.value) for m in emulator.server.store.spreadsheets[sid].all_metadata() if m.key == CLAIM_KEY
    }


def _relay(ledger: Ledger, sid: str) -> Any:
    return relay_sheet_rows(ledger, lambda _sid, _tab: SheetQueueHook(spreadsheet_id=sid).queue("v1"))


class _Conflict(ArticleStepOperator):
    """``publish`` failing permanently (a different page is already at the article's path)."""

    step = "publish"
    requires_extra = None

    def work(self, run: StepRun, context: Any) -> dict[str, Any]:
        raise PermanentStepError("a different page is already published at http://x/a", step="publish")


def test_review_then_a_permanent_failure_each_leave_through_the_outbox_in_one_pass(
    sheets_emulator: SheetsEmulator, article_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, [claim, other] = _claimed(sheets_emulator, monkeypatch, 2)
    _polished(article_ledger, claim)

    sheets_emulator.request_log.reset()
    MarkNeedsReviewOperator(task_id="mark_needs_review", threshold=0.6).execute(
        _context(sid, claim, "mark_needs_review")
    )
    assert dict(sheets_emulator.request_log.counts) == ONE_PASS
    row = _rows(sheets_emulator, sid)[claim.token]
    assert row["status"] == f"NEEDS_REVIEW #{claim.token}" and row["score"] == "0.41"
    assert row["reason"].startswith("score 0.41 below 0.60 after polish: unknown words: huerto")
    assert _anchors(sheets_emulator, sid) == {claim.token, other.token}, "in review: the anchor stays"
    assert pending_sheet_rows(article_ledger) == []

    # approved, then publish fails permanently: FAILED from NEEDS_REVIEW, committed with the
    # item's needs_correction, relayed in one pass
    sheets_emulator.request_log.reset()
    with pytest.raises(AirflowFailException):
        _Conflict(task_id="publish").execute(_context(sid, claim, "publish"))
    assert dict(sheets_emulator.request_log.counts) == ONE_PASS
    row = _rows(sheets_emulator, sid)[claim.token]
    assert row["status"] == f"FAILED #{claim.token}"
    assert row["reason"] == "publish: a different page is already published at http://x/a"
    assert _anchors(sheets_emulator, sid) == {other.token}
    assert article_ledger.item(work_key(claim.row_key)).state == "needs_correction"
    assert pending_sheet_rows(article_ledger) == []


def test_a_rejection_commits_the_decision_and_relays_rejected_with_the_note(
    sheets_emulator: SheetsEmulator, article_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, [claim] = _claimed(sheets_emulator, monkeypatch, 1)
    _polished(article_ledger, claim, 0.3)
    MarkNeedsReviewOperator(task_id="mark_needs_review", threshold=0.6).execute(
        _context(sid, claim, "mark_needs_review")
    )
    review = ArticleReviewOperator(task_id="review")
    sheets_emulator.request_log.reset()
    review._reject(_context(sid, claim, "review"), "=glossary says allotment (ana)")
    assert dict(sheets_emulator.request_log.counts) == ONE_PASS
    row = _rows(sheets_emulator, sid)[claim.token]
    assert (row["status"], row["reason"], row["score"]) == (
        f"REJECTED #{claim.token}", "=glossary says allotment (ana)", "0.30"
    )  # fmt: skip
    assert _anchors(sheets_emulator, sid) == set()
    [decision] = [r for r in article_ledger.results(work_key(claim.row_key)) if r.step == "review"]
    assert decision.payload["decision"] == "rejected"


def test_a_status_is_not_moved_beside_a_url_the_editor_typed_in(
    sheets_emulator: SheetsEmulator, article_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, [claim] = _claimed(sheets_emulator, monkeypatch, 1)
    new_url = "https://news.example.com/typed-in"
    batch_update(
        anonymous_service(sheets_emulator.endpoint), sid, set_row(0, claim.row_number - 1, [new_url])
    )
    with pytest.raises(AirflowFailException):
        _Conflict(task_id="publish").execute(_context(sid, claim, "publish"))
    row = _rows(sheets_emulator, sid)[claim.token]
    assert (row["status"], row["url"]) == (f"PROCESSING #{claim.token}", new_url), "left in flight"
    assert _anchors(sheets_emulator, sid) == {claim.token}
    assert pending_sheet_rows(article_ledger) == [], "settled: sheet_reconcile runs the new URL"


# Commits FAILED for claim 0 (needs_correction), NEEDS_REVIEW for claim 1 (mark_needs_review),
# NEEDS_REVIEW then REJECTED for claim 2, then stands where the tasks would relay: killed there.
COMMITTER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from onceflow.articles.errors import PermanentStepError
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.ledger.steps import InvalidInput, run_keyed_step
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import row_write

    args = json.loads(sys.argv[1])
    ledger = Ledger(create_ledger_engine(args["ledger"]))
    failed, review, rejected = args["claims"]
    both = (Status.PROCESSING, Status.NEEDS_REVIEW)

    def step(claim, name, status, fields, old, fail=False):
        write = row_write(args["target"], claim["token"], status, fields, old=old, row_key=claim["row_key"])

        def work(lease):
            if fail:
                raise PermanentStepError("fetch: 404 not found", step=name)
            return {"status": status.value}

        try:
            run_keyed_step(
                ledger, kind="article", work_key=claim["work_key"], step=name, owner="committer",
                worker_version="v1", work=work, follow_ups=lambda result: [write],
                invalid_follow_ups=lambda exc: [write],
            )
        except InvalidInput:
            pass

    step(failed, "fetch", Status.FAILED, {"reason": "fetch: 404 not found"}, both, fail=True)
    low = {"score": "0.41", "reason": "score 0.41 below 0.60"}
    step(review, "mark_needs_review", Status.NEEDS_REVIEW, low, (Status.PROCESSING,))
    step(rejected, "mark_needs_review", Status.NEEDS_REVIEW, low, (Status.PROCESSING,))
    no = {"score": "0.41", "reason": "wrong register (ana)"}
    step(rejected, "review", Status.REJECTED, no, (Status.NEEDS_REVIEW,))
    pathlib.Path(args["marker"]).write_text("committed")
    time.sleep(600)
    """
)

# One relay pass killed after its sheet batches applied, before the outbox rows are marked.
RELAYER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.sheets import relay
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

    args = json.loads(sys.argv[1])
    outcome = relay.RowWrites.outcome

    def settle_then_stop(self):
        out = outcome(self)  # the sheet batch applied; the outbox rows are marked after this
        pathlib.Path(args["marker"]).write_text(json.dumps(out))
        time.sleep(600)

    relay.RowWrites.outcome = settle_then_stop
    ledger = Ledger(create_ledger_engine(args["ledger"]))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(args["endpoint"]), args["sid"]))
    relay.relay_sheet_rows(ledger, lambda sid, tab: queue)
    """
)


def _run_until(script: str, args: dict[str, Any], marker: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(args)], env=dict(os.environ))
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child exited with {proc.returncode} before {marker.name}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the child never reached {marker.name}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    return proc


def test_killed_after_the_commits_and_after_the_relay_batch_each_row_is_written_once(
    sheets_emulator: SheetsEmulator,
    article_ledger: Ledger,
    ledger_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    sid, claims = _claimed(sheets_emulator, monkeypatch, 3)
    failed, review, rejected = claims
    spec = [{"token": c.token, "row_key": c.row_key, "work_key": work_key(c.row_key)} for c in claims]
    args = {"ledger": ledger_url, "target": f"{sid}/queue", "claims": spec, "marker": str(tmp_path / "c")}
    _run_until(COMMITTER, args, tmp_path / "c")
    assert all(r["status"].startswith("PROCESSING #") for r in _rows(sheets_emulator, sid).values())
    assert len(pending_sheet_rows(article_ledger)) == 4, "FAILED, 2 NEEDS_REVIEW, REJECTED wait"

    relayer = {
        "ledger": ledger_url,
        "endpoint": sheets_emulator.endpoint,
        "sid": sid,
        "marker": str(tmp_path / "r"),
    }
    _run_until(RELAYER, relayer, tmp_path / "r")
    assert json.loads((tmp_path / "r").read_text()) == dict.fromkeys((c.token for c in claims), True)
    after_crash = _rows(sheets_emulator, sid)
    assert {t: r["status"] for t, r in after_crash.items()} == {
        failed.token: f"FAILED #{failed.token}",
        review.token: f"NEEDS_REVIEW #{review.token}",
        rejected.token: f"REJECTED #{rejected.token}",  # straight from PROCESSING: both were pending
    }
    assert after_crash[failed.token]["reason"] == "fetch: 404 not found"
    assert after_crash[rejected.token]["reason"] == "wrong register (ana)"
    assert _anchors(sheets_emulator, sid) == {review.token}, "only the row in review keeps its anchor"
    assert len(pending_sheet_rows(article_ledger)) == 4, "the killed relay marked nothing"

    sheets_emulator.request_log.reset()
    report = _relay(article_ledger, sid)
    assert (report.relayed, sorted(report.written), report.left, report.errors) == (
        4, sorted(c.token for c in claims), [], [],
    )  # fmt: skip
    assert sheets_emulator.request_log.counts.get("values.batchUpdateByDataFilter", 0) == 0, "no field again"
    assert _rows(sheets_emulator, sid) == after_crash
    assert _anchors(sheets_emulator, sid) == {review.token}
    assert pending_sheet_rows(article_ledger) == []
