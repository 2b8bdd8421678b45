"""Position independence: the editor moves rows exactly between the claimer's read and its write.

The editor's change is made through a second real client at the precise moment the claimer's
``batchUpdate`` is about to be sent (a transport that runs a callback first), so each case is
deterministic instead of depending on a lucky race.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_edits import batch_update, delete_rows, insert_rows, set_row

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


class EditorFirst(GoogleSheetsTransport):
    """A transport that lets the editor act once, just before the next ``batchUpdate`` is sent."""

    before_write: Callable[[], None] | None = None

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.before_write is not None:
            action, self.before_write = self.before_write, None
            action()
        return super().batch_update(requests)


def _setup(emulator: SheetsEmulator, rows: list[list[str]]) -> tuple[SheetQueue, EditorFirst, Any, str]:
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *rows]})
    transport = EditorFirst(anonymous_service(emulator.endpoint), sid)
    queue = SheetQueue(transport, spread=1)
    return queue, transport, anonymous_service(emulator.endpoint), sid


def _rows(emulator: SheetsEmulator, sid: str) -> Snapshot:
    return Snapshot.from_values(emulator.values(sid, "queue"))


def test_a_claim_that_lands_on_another_new_row_is_bound_to_the_row_it_took(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, transport, editor, sid = _setup(
        sheets_emulator, [["https://a.example/A", "NEW"], ["https://a.example/B", "NEW"]]
    )
    sheet_id = queue.sheet_id()
    transport.before_write = lambda: batch_update(
        editor, sid, insert_rows(sheet_id, 1), set_row(sheet_id, 1, ["https://a.example/X", "NEW"])
    )
    result = queue.claim(1)  # aims at row 2 (A); X is now row 2
    assert [c.url for c in result.claims] == ["https://a.example/X"], (
        "work is created for the row carrying the token"
    )
    assert result.redirected == 1
    rows = {r.url: r for r in _rows(sheets_emulator, sid).rows}
    assert rows["https://a.example/X"].token == result.claims[0].token
    assert rows["https://a.example/A"].status is Status.NEW, "the row aimed at stays NEW for the next wake-up"


def test_a_claim_aimed_at_a_row_that_moved_under_a_non_new_row_takes_nothing(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, transport, editor, sid = _setup(sheets_emulator, [["https://a.example/A", "NEW"]])
    sheet_id = queue.sheet_id()
    transport.before_write = lambda: batch_update(
        editor, sid, insert_rows(sheet_id, 1), set_row(sheet_id, 1, ["https://a.example/H", "HOLD"])
    )
    result = queue.claim(1)
    assert (result.claims, result.lost) == ([], 1)
    assert [r.status_cell.raw for r in _rows(sheets_emulator, sid).rows] == ["HOLD", "NEW"]


def test_an_unmoved_claim_is_confirmed_by_its_guard_without_a_second_read(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, _, _, _ = _setup(sheets_emulator, [[f"https://a.example/{i}", "NEW"] for i in range(30)])
    sheets_emulator.request_log.reset()
    result = queue.claim(10)
    assert len(result.claims) == 10 and result.redirected == 0
    # one read (the tab id and the values in one spreadsheets.get) and one write
    assert sheets_emulator.request_log.counts == {"spreadsheets.get": 1, "spreadsheets.batchUpdate": 1}


def test_later_writes_find_the_row_by_token_after_rows_above_are_deleted(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, _, editor, sid = _setup(sheets_emulator, [[f"https://a.example/{i}", "NEW"] for i in range(5)])
    claim = next(c for c in queue.claim(5).claims if c.url.endswith("/4"))
    sheet_id = queue.sheet_id()
    batch_update(editor, sid, delete_rows(sheet_id, 1, 3))
    queue.write_fields(claim.token, {"score": "0.9", "published_url": "https://pub.example/4"})
    assert queue.transition(claim.token, Status.PROCESSING, Status.DONE)
    assert not queue.transition(claim.token, Status.PROCESSING, Status.DONE), "a fenced write applies once"
    row = queue.find(claim.token)
    assert row is not None and row.url == "https://a.example/4" and row.number == claim.row_number - 2
    assert (row.status, row.get("score"), row.get("published_url")) == (
        Status.DONE,
        "0.9",
        "https://pub.example/4",
    )
    others = [r for r in _rows(sheets_emulator, sid).rows if r.token != claim.token]
    assert all(not r.get("score") and not r.get("published_url") for r in others)
