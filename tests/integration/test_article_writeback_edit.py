"""An editor types a new URL into a row while its write-back is on the way (issue 22, defect 3).

``write_done`` checks the row's URL when it reads the row, then writes the fields, then moves the
status. An edit that lands after the read used to go unseen: the row became DONE beside the new
URL with the old article's link, and the new URL was never processed. Now the status move carries
position-aimed guards (the row's status and URL cells, in the same atomic batch); a guard that
misses sends the write-back to read the row back, and a row that no longer holds the published
article is put back in flight (its old status, a fresh anchor, the link cleared), never left DONE.

Real google-api-python-client against the Sheets emulator over HTTP. The editor's edit is made
by a second client just before the write-back's status batch is sent (a transport subclass),
because the point is the edit's timing against that one request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.articles.writeback import write_done
from onceflow.hooks.sheets import SheetQueueHook
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_edits import batch_update, insert_rows, set_row

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
URLS = ["https://news.example.com/kept", "https://news.example.com/edited"]
NEW_URL = "https://news.example.com/typed-in-flight"
LINK = "http://127.0.0.1:8080/published/kept/v1/index.html"


class _EditBeforeDone(GoogleSheetsTransport):
    """Runs ``edit`` (the editor) once, just before the first batch that moves a row to DONE."""

    def __init__(self, service: Any, sid: str, edit: Any) -> None:
        super().__init__(service, sid)
        self.edit = edit

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.edit and any(
            str(r.get("findReplace", {}).get("replacement", "")).startswith("DONE #") for r in requests
        ):
            edit, self.edit = self.edit, None
            edit()
        return super().batch_update(requests)


def _claimed(emulator: SheetsEmulator) -> tuple[str, list[Any]]:
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *([u, "NEW"] for u in URLS)]})
    claims = SheetQueueHook(spreadsheet_id=sid).queue("v1", spread=1).claim(2).claims
    return sid, sorted(claims, key=lambda c: c.row_number)


def _queue(emulator: SheetsEmulator, sid: str, edit: Any) -> SheetQueue:
    return SheetQueue(_EditBeforeDone(anonymous_service(emulator.endpoint), sid, edit))


def _stored(emulator: SheetsEmulator, sid: str, token: str) -> Any:
    rows = Snapshot.from_values(emulator.values(sid, "queue")).rows_with_token(token)
    assert len(rows) == 1
    return rows[0]


def _anchored(emulator: SheetsEmulator, sid: str) -> list[str]:
    return [
        str(m.value) for m in emulator.server.store.spreadsheets[sid].all_metadata() if m.key == CLAIM_KEY
    ]


def test_defect3_a_url_typed_in_after_the_read_is_not_left_done_with_the_old_link(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid, claims = _claimed(sheets_emulator)
    target = claims[1]
    editor = anonymous_service(sheets_emulator.endpoint)

    def type_new_url() -> None:
        batch_update(editor, sid, set_row(0, target.row_number - 1, [NEW_URL]))

    queue = _queue(sheets_emulator, sid, type_new_url)
    done = write_done(queue, target.token, score=0.9, published_url=LINK, run_id="r1", row_key=target.row_key)
    assert not done, "the row no longer holds the published article"
    row = _stored(sheets_emulator, sid, target.token)
    assert row.url == NEW_URL
    assert row.status is Status.PROCESSING, f"left {row.status_cell.raw!r} beside the new URL"
    assert row.get("published_url") == "", "the old article's link is not beside the new URL"
    assert _anchored(sheets_emulator, sid).count(target.token) == 1, "in flight again: anchored once"


def test_defect3_the_guard_also_holds_when_rows_moved_and_the_url_was_edited(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid, claims = _claimed(sheets_emulator)
    target = claims[1]
    editor = anonymous_service(sheets_emulator.endpoint)

    def insert_then_type() -> None:  # two rows on top, then the new URL into the moved row
        batch_update(editor, sid, insert_rows(0, 1, 2))
        batch_update(editor, sid, set_row(0, target.row_number + 1, [NEW_URL]))

    queue = _queue(sheets_emulator, sid, insert_then_type)
    assert not write_done(
        queue, target.token, score=0.9, published_url=LINK, run_id="r1", row_key=target.row_key
    )
    row = _stored(sheets_emulator, sid, target.token)
    assert (row.url, row.status, row.get("published_url")) == (NEW_URL, Status.PROCESSING, "")


def test_rows_that_only_moved_still_finish_done(sheets_emulator: SheetsEmulator) -> None:
    sid, claims = _claimed(sheets_emulator)
    editor = anonymous_service(sheets_emulator.endpoint)
    queue = _queue(sheets_emulator, sid, lambda: batch_update(editor, sid, insert_rows(0, 1, 3)))
    target = claims[0]
    assert write_done(queue, target.token, score=0.9, published_url=LINK, run_id="r0", row_key=target.row_key)
    row = _stored(sheets_emulator, sid, target.token)
    assert (row.url, row.status, row.get("published_url")) == (URLS[0], Status.DONE, LINK)
    assert target.token not in _anchored(sheets_emulator, sid)
