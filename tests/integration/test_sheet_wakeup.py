"""A ``sheet_claim`` wake-up claims K rows and relays K write-backs in 1 read + 2 writes (issue 22).

The relay rides in the claim: the claim's ``spreadsheets.get`` brings the tab id, the values and
every row's anchors (``DimensionProperties.developerMetadata``), which is all the relay reads; the
relay writes its fields through the anchors, and its fenced moves, URL guards and anchor
deletions go first in the claim's ``batchUpdate``. It was 3 reads + 3 writes: the relay's own
``spreadsheets.get`` for the tab id, its by-anchor read and its own status batch. No guard is
weaker: the moves are the same fenced ``findReplace``s, a URL typed in before the batch lands is
caught by the same position guards, and a batch lost or failing after it applied is settled by
reading back, for the claims and the write-backs alike. Real client, emulator over HTTP, SQLite
ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from sheet_outbox import link, publish_into_outbox, queue_of

from onceflow.ledger.outbox import pending_sheet_rows
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.wakeup import wake_up
from onceflow.testing.sheet_edits import batch_update, set_row

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.sheets.claim import Claim
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
K = 10


def _steady_state(emulator: SheetsEmulator, ledger: Ledger) -> tuple[str, list[Claim]]:
    """2K NEW rows; the first K claimed by an earlier wake-up and published, their DONE in the outbox."""
    rows = [[f"https://news.example.com/wake-{i}", "NEW"] for i in range(2 * K)]
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *rows]})
    earlier = queue_of(emulator, sid).claim(K).claims
    publish_into_outbox(ledger, sid, earlier)
    return sid, earlier


def _rows(emulator: SheetsEmulator, sid: str) -> dict[str, Any]:
    return {r.token: r for r in Snapshot.from_values(emulator.values(sid, "queue")).rows if r.token}


def _anchors(emulator: SheetsEmulator, sid: str) -> list[str]:
    book = emulator.server.store.spreadsheets[sid]
    return sorted(str(m.value) for m in book.all_metadata() if m.key == CLAIM_KEY)


def test_a_wake_up_claims_ten_rows_and_relays_ten_write_backs_in_one_read_and_two_writes(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, earlier = _steady_state(sheets_emulator, sqlite_ledger)
    sheets_emulator.request_log.reset()
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K)
    assert sheets_emulator.request_log.counts == {
        "spreadsheets.get": 1,  # the tab id, its values, its rows' anchors
        "values.batchUpdateByDataFilter": 1,  # the write-backs' fields, through the anchors
        "spreadsheets.batchUpdate": 1,  # their moves, guards and anchor deletions, then the claims
    }
    assert (sheets_emulator.request_log.reads, sheets_emulator.request_log.writes) == (1, 2)
    assert len(woke.claim.claims) == K and sorted(woke.relayed.written) == sorted(c.token for c in earlier)
    rows = _rows(sheets_emulator, sid)
    for claim in earlier:
        row = rows[claim.token]
        assert (
            row.status is Status.DONE
            and row.get("published_url") == link(claim)
            and row.get("score") == "0.90"
        )
    assert _anchors(sheets_emulator, sid) == sorted(c.token for c in woke.claim.claims), (
        "final rows keep none"
    )
    assert pending_sheet_rows(sqlite_ledger) == []


def test_with_nothing_new_the_relay_sends_its_own_batch_from_the_claims_read(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, _ = _steady_state(sheets_emulator, sqlite_ledger)
    queue_of(sheets_emulator, sid).claim(K)  # nothing NEW is left
    sheets_emulator.request_log.reset()
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K)
    assert woke.claim.aimed == 0 and len(woke.relayed.written) == K
    assert sheets_emulator.request_log.counts == {
        "spreadsheets.get": 1,
        "values.batchUpdateByDataFilter": 1,
        "spreadsheets.batchUpdate": 1,
    }


@pytest.mark.parametrize("fault", ["apply_then_drop", "apply_then_fail"])
def test_a_merged_batch_whose_reply_is_lost_after_it_applied_is_settled_by_reading_back(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger, fault: str
) -> None:
    """``apply_then_drop``: the connection closes after the batch applied and httplib2 sends it
    again (the moves and claims of the second copy find nothing to change); ``apply_then_fail``: a
    500 after it applied. Either way the claims are found by their tokens and the write-backs by
    their rows' statuses, each row written once, one anchor per claim."""
    sid, earlier = _steady_state(sheets_emulator, sqlite_ledger)
    sheets_emulator.faults.add(fault, count=1, methods=["spreadsheets.batchUpdate"])
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K)
    assert len(woke.claim.claims) == K
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and not woke.relayed.errors
    rows = _rows(sheets_emulator, sid)
    assert {rows[c.token].status for c in earlier} == {Status.DONE}
    assert {rows[c.token].status for c in woke.claim.claims} == {Status.PROCESSING}
    assert _anchors(sheets_emulator, sid) == sorted(c.token for c in woke.claim.claims), "one anchor each"
    assert pending_sheet_rows(sqlite_ledger) == []


class _EditsBeforeTheBatch(GoogleSheetsTransport):
    """Runs the editor's action just before the wake-up's ``spreadsheets.batchUpdate``."""

    before_batch: Any = None

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        action, self.before_batch = self.before_batch, None
        if action is not None:
            action()
        return super().batch_update(requests)


def test_a_url_typed_into_a_relayed_row_before_the_merged_batch_lands_is_not_left_done(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, earlier = _steady_state(sheets_emulator, sqlite_ledger)
    typed = earlier[3]
    editor = anonymous_service(sheets_emulator.endpoint)
    transport = _EditsBeforeTheBatch(anonymous_service(sheets_emulator.endpoint), sid)
    transport.before_batch = lambda: batch_update(
        editor, sid, set_row(0, typed.row_number - 1, ["https://news.example.com/typed-in"])
    )
    woke = wake_up(queue_of(sheets_emulator, sid, transport), sqlite_ledger, K)
    assert transport.before_batch is None, "the editor acted between the wake-up's read and its batch"
    assert len(woke.claim.claims) == K
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier if c is not typed)
    row = _rows(sheets_emulator, sid)[typed.token]
    # put back in flight under its claim, its anchor back, no link: sheet_reconcile runs the new URL
    assert (row.url, row.status, row.get("published_url")) == (
        "https://news.example.com/typed-in",
        Status.PROCESSING,
        "",
    )
    assert typed.token in _anchors(sheets_emulator, sid)
