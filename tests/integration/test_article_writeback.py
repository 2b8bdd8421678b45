"""The article chain's write-back to its sheet row: DONE, NEEDS_REVIEW, REJECTED, FAILED.

Real google-api-python-client against the Sheets emulator over HTTP. Every check reads the
emulator's stored state (cells as stored, with formulas kept apart from text; row anchors; the
request log), not the queue's own reads. Each write is made through a fresh ``SheetQueue`` from
``SheetQueueHook``, as an Airflow task makes it, so the request counts are what a task pays.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.articles.writeback import write_done, write_failed, write_needs_review, write_rejected
from onceflow.hooks.sheets import SheetQueueHook
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.transport import anonymous_service
from onceflow.testing.sheet_edits import batch_update, delete_rows, insert_rows, set_row, sort_rows
from onceflow.testing.sheets_emulator.cells import Formula

if TYPE_CHECKING:
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
#: what a task pays per final write-back: 1 read (the tab with its id and its rows' anchors), 2
#: writes (the fields through the anchor; the status move and the anchor's deletion)
WRITE_BACK = {
    "spreadsheets.get": 1,
    "values.batchUpdateByDataFilter": 1,
    "spreadsheets.batchUpdate": 1,
}
#: NEEDS_REVIEW (the anchor kept): the row by its anchor, the fields, the tab id, the status move
NEEDS_REVIEW = {
    "spreadsheets.get": 1,
    "values.batchGetByDataFilter": 1,
    "values.batchUpdateByDataFilter": 1,
    "spreadsheets.batchUpdate": 1,
}


def _sheet(emulator: SheetsEmulator, n: int) -> tuple[str, list[str], list[str]]:
    urls = [f"https://news.example.com/article-{i}" for i in range(n)]
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    claims = SheetQueueHook(spreadsheet_id=sid).queue("v1", spread=1).claim(n).claims
    assert len(claims) == n
    by_url = {c.url: c.token for c in claims}
    return sid, urls, [by_url[u] for u in urls]


def _queue(sid: str) -> SheetQueue:
    return SheetQueueHook(spreadsheet_id=sid).queue("v1")


def _anchors(emulator: SheetsEmulator, sid: str) -> set[str]:
    book = emulator.server.store.spreadsheets[sid]
    return {str(m.value) for m in book.all_metadata() if m.key == CLAIM_KEY}


def _row(emulator: SheetsEmulator, sid: str, token: str) -> dict[str, Any]:
    """The stored cells of the one row carrying ``token`` (as stored: str, number or Formula)."""
    sheet = emulator.server.store.spreadsheets[sid].sheet_by_title("queue")
    assert sheet is not None
    found = [
        dict(zip(HEADER, [sheet.get(r, c) for c in range(len(HEADER))], strict=True))
        for r in range(1, len(sheet.rows))
        if isinstance(sheet.get(r, 1), str) and str(sheet.get(r, 1)).endswith(f"#{token}")
    ]
    assert len(found) == 1, f"{token} is on {len(found)} rows"
    return found[0]


def _counted(emulator: SheetsEmulator) -> dict[str, int]:
    return dict(emulator.request_log.counts)


def test_done_writes_score_link_and_run_id_removes_the_anchor_in_one_read_and_two_writes(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid, urls, tokens = _sheet(sheets_emulator, 2)
    assert _anchors(sheets_emulator, sid) == set(tokens)
    sheets_emulator.request_log.reset()
    assert write_done(
        _queue(sid), tokens[0], score=0.8734, published_url="http://127.0.0.1:8080/published/a/v1/index.html",
        run_id="sheet__abc__v1",
    )  # fmt: skip
    assert _counted(sheets_emulator) == WRITE_BACK
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"DONE #{tokens[0]}" and row["url"] == urls[0]
    assert (row["score"], row["published_url"], row["run_id"]) == (
        "0.87",
        "http://127.0.0.1:8080/published/a/v1/index.html",
        "sheet__abc__v1",
    )
    assert _anchors(sheets_emulator, sid) == {tokens[1]}, "the final transition removes its anchor only"
    assert _row(sheets_emulator, sid, tokens[1])["status"] == f"PROCESSING #{tokens[1]}"

    # a retry (the task killed after the write, before it could report) is harmless
    assert write_done(
        _queue(sid), tokens[0], score=0.8734, published_url=row["published_url"], run_id="sheet__abc__v1"
    )
    assert _row(sheets_emulator, sid, tokens[0]) == row
    assert _anchors(sheets_emulator, sid) == {tokens[1]}, "no anchor left behind by the retry"


def test_needs_review_keeps_the_anchor_and_an_approval_then_finishes_the_row(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid, _, tokens = _sheet(sheets_emulator, 2)
    sheets_emulator.request_log.reset()
    assert write_needs_review(_queue(sid), tokens[0], score=0.41, reason="score 0.41 below 0.60 after polish")
    assert _counted(sheets_emulator) == NEEDS_REVIEW
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"NEEDS_REVIEW #{tokens[0]}"
    assert (row["score"], row["reason"]) == ("0.41", "score 0.41 below 0.60 after polish")
    assert _anchors(sheets_emulator, sid) == set(tokens), "NEEDS_REVIEW is not final: the anchor stays"

    # repeated (a retry of the task): reads, finds it done, writes nothing
    sheets_emulator.request_log.reset()
    assert write_needs_review(_queue(sid), tokens[0], score=0.41, reason="score 0.41 below 0.60 after polish")
    assert sheets_emulator.request_log.writes == 0

    # the sweep leaves an anchor of a row in review alone (it is in flight)
    assert _queue(sid).sweep_anchors() == 0
    assert _anchors(sheets_emulator, sid) == set(tokens)

    # approved: DONE from NEEDS_REVIEW in the same one read and two writes
    sheets_emulator.request_log.reset()
    assert write_done(_queue(sid), tokens[0], score=0.41, published_url="https://pages.example/a", run_id="r")
    assert _counted(sheets_emulator) == WRITE_BACK
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"DONE #{tokens[0]}" and row["published_url"] == "https://pages.example/a"
    assert _anchors(sheets_emulator, sid) == {tokens[1]}


def test_a_rejection_ends_the_row_with_the_reviewers_note_as_text(sheets_emulator: SheetsEmulator) -> None:
    sid, _, tokens = _sheet(sheets_emulator, 2)
    note = '=HYPERLINK("https://evil.example/x","click me")'
    # only a row in review can be rejected: the fence refuses a PROCESSING row, writing nothing
    assert not write_rejected(_queue(sid), tokens[0], note=note, score=0.3)
    assert _row(sheets_emulator, sid, tokens[0])["reason"] is None
    assert write_needs_review(_queue(sid), tokens[0], score=0.3, reason="low score")
    sheets_emulator.request_log.reset()
    assert write_rejected(_queue(sid), tokens[0], note=note, score=0.3)
    assert _counted(sheets_emulator) == WRITE_BACK
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"REJECTED #{tokens[0]}"
    assert row["reason"] == note and type(row["reason"]) is str, "stored as text, not a Formula"
    assert not isinstance(row["reason"], Formula)
    assert _anchors(sheets_emulator, sid) == {tokens[1]}
    # a rejected row is final: a late DONE (a zombie try) changes nothing
    assert not write_done(
        _queue(sid), tokens[0], score=0.3, published_url="https://pages.example/x", run_id="r"
    )
    assert _row(sheets_emulator, sid, tokens[0])["status"] == f"REJECTED #{tokens[0]}"
    assert _row(sheets_emulator, sid, tokens[0])["published_url"] is None


@pytest.mark.parametrize("reason", ["=1+1", "+33 555 0100", "-2", "@SUM(A1:A3)", '=HYPERLINK("http://x")'])
def test_failed_stores_the_reason_as_typed_text_never_a_formula_or_number(
    sheets_emulator: SheetsEmulator, reason: str
) -> None:
    sid, _, tokens = _sheet(sheets_emulator, 1)
    sheets_emulator.request_log.reset()
    assert write_failed(_queue(sid), tokens[0], reason=reason)
    assert _counted(sheets_emulator) == WRITE_BACK
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"FAILED #{tokens[0]}"
    # RAW: USER_ENTERED would store "=1+1" as a Formula and "-2" as the number -2
    assert type(row["reason"]) is str and row["reason"] == reason
    assert _anchors(sheets_emulator, sid) == set()


def test_rows_moved_by_the_editor_between_steps_are_still_found_by_token(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid, urls, tokens = _sheet(sheets_emulator, 4)
    editor = anonymous_service(sheets_emulator.endpoint)
    tab = _queue(sid).sheet_id()
    # between the claim and the review: two rows inserted on top, one typed in, a row deleted
    batch_update(editor, sid, insert_rows(tab, 1, 2), set_row(tab, 1, ["https://other.example/1", "HOLD"]))
    batch_update(editor, sid, delete_rows(tab, 3, 4))  # the first claimed row (now row index 3)
    assert write_needs_review(_queue(sid), tokens[2], score=0.2, reason="low")
    # between the review and the approval: the whole sheet sorted by URL, descending
    batch_update(editor, sid, sort_rows(tab, 0, descending=True))
    assert write_done(_queue(sid), tokens[2], score=0.2, published_url="https://pages.example/2", run_id="r2")
    assert write_failed(_queue(sid), tokens[3], reason="404 not found")
    snapshot = Snapshot.from_values(sheets_emulator.values(sid, "queue"))
    by_token = {r.token: r for r in snapshot.rows if r.token}
    assert (by_token[tokens[2]].url, by_token[tokens[2]].status) == (urls[2], Status.DONE)
    assert by_token[tokens[2]].get("published_url") == "https://pages.example/2"
    assert (by_token[tokens[3]].url, by_token[tokens[3]].status) == (urls[3], Status.FAILED)
    assert by_token[tokens[3]].get("reason") == "404 not found"
    # the deleted row's write finds no row and writes nothing anywhere
    assert tokens[0] not in by_token
    assert not write_done(
        _queue(sid), tokens[0], score=1, published_url="https://pages.example/0", run_id="r0"
    )
    untouched = [r for r in snapshot.rows if r.token not in (tokens[2], tokens[3])]
    after = Snapshot.from_values(sheets_emulator.values(sid, "queue"))
    assert [r.cells for r in after.rows if r.token not in (tokens[2], tokens[3])] == [
        r.cells for r in untouched
    ]
    assert by_token[tokens[1]].status is Status.PROCESSING
    assert _anchors(sheets_emulator, sid) == {tokens[1]}


def test_a_row_the_reconciler_finished_is_not_overwritten(sheets_emulator: SheetsEmulator) -> None:
    sid, _, tokens = _sheet(sheets_emulator, 1)
    assert _queue(sid).finish(tokens[0], Status.FAILED, {"reason": "run failed after 3 re-drives"})
    assert not write_done(
        _queue(sid), tokens[0], score=0.9, published_url="https://pages.example/z", run_id="r"
    )
    assert not write_needs_review(_queue(sid), tokens[0], score=0.1, reason="low")
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"FAILED #{tokens[0]}" and row["reason"] == "run failed after 3 re-drives"
    assert row["published_url"] is None and row["score"] is None


def test_bad_values_are_refused_before_any_request(sheets_emulator: SheetsEmulator) -> None:
    sid, _, tokens = _sheet(sheets_emulator, 1)
    sheets_emulator.request_log.reset()
    with pytest.raises(ValueError, match="finite"):
        write_done(_queue(sid), tokens[0], score=math.nan, published_url="https://p.example/", run_id="r")
    with pytest.raises(ValueError, match="reason must not be empty"):
        write_failed(_queue(sid), tokens[0], reason="  \n ")
    with pytest.raises(ValueError, match="finite"):
        write_needs_review(_queue(sid), tokens[0], score=math.inf, reason="x")
    assert sheets_emulator.request_log.total == 0


def test_reconcile_gives_up_on_a_row_in_review_whose_run_keeps_failing(
    sheets_emulator: SheetsEmulator,
) -> None:
    from datetime import timedelta

    from onceflow.sheets import reconcile
    from onceflow.sheets.model import token_time

    sid, urls, tokens = _sheet(sheets_emulator, 1)
    assert write_needs_review(_queue(sid), tokens[0], score=0.2, reason="low")
    queue = _queue(sid)
    claimed = token_time(tokens[0])
    assert claimed is not None
    now = claimed + timedelta(days=2)
    redrives = [
        {
            "time": f"t{i}",
            "action": "reset_run",
            "reason": reconcile.REDRIVE_FAILED,
            "claim_token": tokens[0],
            "url": urls[0],
        }
        for i in range(3)
    ]
    plan = reconcile.plan(
        queue.snapshot(),
        now=now,
        lease=timedelta(minutes=30),
        version="v1",
        run_state=lambda _: "failed",
        audit=redrives,
    )
    assert [(a.kind, a.new_status) for a in plan.actions] == [("transition", Status.FAILED)]
    entries = reconcile.apply(plan.actions, queue, now=now, create_run=lambda *_: "exists")
    assert [e["action"] for e in entries] == ["transition"]
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"FAILED #{tokens[0]}", "moved from NEEDS_REVIEW, not only from PROCESSING"
    assert _anchors(sheets_emulator, sid) == set()


def test_failed_from_either_in_flight_status_in_one_batch(sheets_emulator: SheetsEmulator) -> None:
    sid, _, tokens = _sheet(sheets_emulator, 2)
    assert write_needs_review(_queue(sid), tokens[1], score=0.1, reason="low")
    either = (Status.PROCESSING, Status.NEEDS_REVIEW)
    for token in tokens:
        sheets_emulator.request_log.reset()
        assert write_failed(_queue(sid), token, reason="translate: Apertium pair missing", old=either)
        assert _counted(sheets_emulator) == WRITE_BACK
        assert _row(sheets_emulator, sid, token)["status"] == f"FAILED #{token}"
    assert _anchors(sheets_emulator, sid) == set()
    # the default is PROCESSING only: a row in review is not failed by it
    sid, _, tokens = _sheet(sheets_emulator, 1)
    assert write_needs_review(_queue(sid), tokens[0], score=0.1, reason="low")
    assert not write_failed(_queue(sid), tokens[0], reason="x")
    assert _row(sheets_emulator, sid, tokens[0])["status"] == f"NEEDS_REVIEW #{tokens[0]}"


def test_a_row_given_up_after_its_re_drives_says_why_on_the_row(sheets_emulator: SheetsEmulator) -> None:
    """A transient error that outlives Airflow's retries and every re-drive (a 503 that never
    ends, a bad ``onceflow_translate`` connection): the row ends FAILED with the give-up and the
    ledger's last error in its ``reason`` cell, where the editor looks; it used to be empty."""
    from datetime import timedelta

    from onceflow.sheets import reconcile
    from onceflow.sheets.ledger_link import LedgerView
    from onceflow.sheets.model import token_time

    sid, urls, tokens = _sheet(sheets_emulator, 1)
    queue = _queue(sid)
    claimed = token_time(tokens[0])
    assert claimed is not None
    redrives = [
        {"time": f"t{i}", "action": "reset_run", "reason": reconcile.REDRIVE_FAILED,
         "claim_token": tokens[0], "url": urls[0]}
        for i in range(3)
    ]  # fmt: skip
    error = "TranslateConfigError: connection 'onceflow_translate': backend 'google' needs extra 'project_id'"
    plan = reconcile.plan(
        queue.snapshot(),
        now=claimed + timedelta(days=1),
        lease=timedelta(minutes=30),
        version="v1",
        run_state=lambda _: "failed",
        audit=redrives,
        ledger=lambda _: LedgerView("pending", False, error + "\nTraceback ...", 7),
    )
    reconcile.apply(plan.actions, queue, now=claimed + timedelta(days=1), create_run=lambda *_: "exists")
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"FAILED #{tokens[0]}"
    assert row["reason"] == f"run failed after 3 re-drives; row marked FAILED; ledger: {error}"


def test_a_row_whose_url_the_editor_changed_in_flight_is_not_marked_done_with_the_old_link(
    sheets_emulator: SheetsEmulator,
) -> None:
    """While an article waits for its reviewer the editor types another article's URL into its
    row. The approval publishes the old article; write-back must not put that link beside the new
    URL and call the row DONE (the new URL would never be processed). The row stays in review
    with its anchor, for ``sheet_reconcile`` to run under its new URL."""
    from onceflow.sheets.validation import judge_url

    sid, _, tokens = _sheet(sheets_emulator, 2)
    keys = {
        r.token: judge_url(r).key for r in Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows
    }
    assert write_needs_review(_queue(sid), tokens[0], score=0.3, reason="low")
    editor = anonymous_service(sheets_emulator.endpoint)
    batch_update(editor, sid, set_row(_queue(sid).sheet_id(), 1, ["https://news.example.com/another-story"]))
    assert _row(sheets_emulator, sid, tokens[0])["url"] == "https://news.example.com/another-story"

    link = "https://pages.example/0"
    assert not write_done(
        _queue(sid), tokens[0], score=0.9, published_url=link, run_id="r0", row_key=keys[tokens[0]]
    )
    row = _row(sheets_emulator, sid, tokens[0])
    assert row["status"] == f"NEEDS_REVIEW #{tokens[0]}" and not row["published_url"], row
    assert _anchors(sheets_emulator, sid) == set(tokens), "still in flight: the anchor stays"
    # the other row, still its article, finishes as usual
    assert write_done(
        _queue(sid), tokens[1], score=0.9, published_url=link, run_id="r1", row_key=keys[tokens[1]]
    )
    assert _row(sheets_emulator, sid, tokens[1])["status"] == f"DONE #{tokens[1]}"
