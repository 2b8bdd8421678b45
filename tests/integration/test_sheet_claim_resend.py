"""A claim batch that httplib2 sends twice: the first copy applied, its reply lost.

httplib2 (under google-api-python-client) sends a request again, on a fresh connection, when the
connection closes before any response line, and it does so whatever ``num_retries`` says. The
emulator's ``apply_then_drop`` fault does exactly that to the server side: the batch is applied,
then the connection is closed. The resent copy finds the cells already carrying its own tokens
and replies 0 occurrences; the claim must still be recognised as won (read back), keep its row
anchors, and hand out its rows.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.retry import Backoff
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
URLS = [f"https://news.example.com/{i}" for i in range(5)]


def _setup(emulator: SheetsEmulator) -> tuple[SheetQueue, str]:
    sid = emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in URLS)]})
    transport = GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)
    return SheetQueue(transport, backoff=Backoff(base=0.05, cap=0.5), rng=random.Random(1)), sid


def test_a_claim_resent_after_its_reply_was_dropped_is_still_won(sheets_emulator: SheetsEmulator) -> None:
    queue, sid = _setup(sheets_emulator)
    queue.sheet_id()  # the tab ids first, so the fault hits the claim batch
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
    result = queue.claim(5)
    log = sheets_emulator.request_log
    assert log.snapshot()["faults"] == {"apply_then_drop": 1}
    assert log["spreadsheets.batchUpdate"] >= 2, "httplib2 did not resend: the test proves nothing"
    # every row was won by the first copy: the claims are handed out, bound to their own rows
    assert sorted(c.url for c in result.claims) == URLS and result.lost == 0
    snapshot = Snapshot.from_values(sheets_emulator.values(sid, "queue"))
    for claim in result.claims:
        rows = snapshot.rows_with_token(claim.token)
        assert len(rows) == 1 and rows[0].status is Status.PROCESSING and rows[0].url == claim.url
    # their anchors were kept, so the next write goes straight through them (no adoption)
    anchored = {
        m.value for m in sheets_emulator.server.store.spreadsheets[sid].all_metadata() if m.key == CLAIM_KEY
    }
    assert anchored == {c.token for c in result.claims}
    log.reset()
    queue.write_fields(result.claims[0].token, {"run_id": "sheet__x__v1"})
    assert dict(log.counts) == {"values.batchGetByDataFilter": 1, "values.batchUpdateByDataFilter": 1}


def test_a_final_transition_resent_after_its_reply_was_dropped_reports_moved(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, _ = _setup(sheets_emulator)
    claims = queue.claim(5).claims
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
    assert queue.finish(claims[0].token, Status.DONE, {"published_url": "https://pub.example.org/0"})
    assert sheets_emulator.request_log.snapshot()["faults"] == {"apply_then_drop": 1}
    row = queue.find(claims[0].token)
    assert row is not None and row.status is Status.DONE


def test_a_claim_applied_twice_with_both_replies_lost_keeps_one_anchor_per_row(
    sheets_emulator: SheetsEmulator,
) -> None:
    """The resend's connection is dropped too: both copies applied, no reply at all. The claims are
    won (read back), and the second copy's anchors, whose ids no reply gave, are found in the
    read-back (the tab with its rows' anchors) and deleted: each row in flight holds one anchor.
    The fault schedules found the second anchors left (seed 1663 of 200-1999, 2026-12-03)."""
    from collections import Counter

    queue, sid = _setup(sheets_emulator)
    queue.sheet_id()
    sheets_emulator.faults.add("apply_then_drop", count=2, methods=["spreadsheets.batchUpdate"])
    result = queue.claim(5)
    assert sheets_emulator.request_log.snapshot()["faults"] == {"apply_then_drop": 2}
    assert sorted(c.url for c in result.claims) == URLS and result.recovered == 5
    book = sheets_emulator.server.store.spreadsheets[sid]
    assert Counter(m.value for m in book.all_metadata() if m.key == CLAIM_KEY) == dict.fromkeys(
        (c.token for c in result.claims), 1
    )
