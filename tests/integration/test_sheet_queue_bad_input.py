"""Bad input, through the real client against the Sheets emulator: each case of issue 3's list."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets.model import MissingColumnsError, Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.wakeup import wake_up
from onceflow.testing.sheets_emulator.cells import Formula

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.ledger import Ledger
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


def _ticking_clock() -> Callable[[], datetime]:
    """One second later at every call: claims made one after the other never share a token
    second, so "the earliest claim owns the URL" does not fall to the tokens' random suffixes."""
    ticks = itertools.count()
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return lambda: start + timedelta(seconds=next(ticks))


def _queue(emulator: SheetsEmulator, rows: list[list[Any]], **options: Any) -> tuple[SheetQueue, str]:
    sid = emulator.create_spreadsheet("articles", sheets={"queue": rows}, **options)
    transport = GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)
    return SheetQueue(transport, spread=1, clock=_ticking_clock()), sid


def _rows(emulator: SheetsEmulator, sid: str) -> Snapshot:
    return Snapshot.from_values(emulator.values(sid, "queue"))


def test_empty_and_malformed_urls_are_marked_invalid_with_a_reason(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    queue, sid = _queue(
        sheets_emulator,
        [
            HEADER,
            ["", "NEW"],
            ["not a url", "NEW"],
            ["ftp://x.example/a", "NEW"],
            ["https://ok.example/a", "NEW"],
        ],
    )
    result = wake_up(queue, sqlite_ledger, 10).claim  # as sheet_claim: INVALID leaves through the outbox
    assert [c.url for c in result.claims] == ["https://ok.example/a"]
    rows = _rows(sheets_emulator, sid).rows
    assert [r.status for r in rows[:3]] == [Status.INVALID] * 3
    assert [r.get("reason") for r in rows[:3]] == [
        "empty URL",
        "URL contains whitespace: 'not a url'",
        "URL must start with http:// or https://: 'ftp://x.example/a'",
    ]
    assert rows[3].status is Status.PROCESSING and not rows[3].get("reason")


def test_the_later_of_two_rows_with_one_url_is_a_duplicate_pointing_at_the_first(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    queue, sid = _queue(
        sheets_emulator,
        [
            HEADER,
            ["https://a.example/x", "NEW"],
            ["https://b.example/y", "NEW"],
            [" https://A.example/x#c", "NEW"],
        ],
    )
    result = wake_up(queue, sqlite_ledger, 10).claim
    assert sorted(c.url for c in result.claims) == ["https://a.example/x", "https://b.example/y"]
    rows = _rows(sheets_emulator, sid).rows
    assert rows[0].status is Status.PROCESSING
    assert rows[2].status is Status.DUPLICATE
    assert rows[2].get("reason") == "duplicate of row 2 (https://a.example/x)"
    # and a NEW row added later for an article already claimed is a duplicate too
    service = anonymous_service(sheets_emulator.endpoint)
    service.spreadsheets().values().append(
        spreadsheetId=sid,
        range="queue",
        valueInputOption="RAW",
        body={"values": [["https://b.example/y", "NEW"]]},
    ).execute()
    assert wake_up(queue, sqlite_ledger, 10).claim.claims == []
    last = _rows(sheets_emulator, sid).rows[-1]
    assert last.status is Status.DUPLICATE and last.get("reason").startswith("duplicate of row 3")


def test_stray_whitespace_and_lower_case_status_is_claimed(sheets_emulator: SheetsEmulator) -> None:
    queue, sid = _queue(
        sheets_emulator,
        [
            HEADER,
            ["https://a.example/1", " new"],
            ["https://a.example/2", "New "],
            ["https://a.example/3", "nEw"],
        ],
    )
    assert len(queue.claim(10).claims) == 3
    assert all(r.status is Status.PROCESSING for r in _rows(sheets_emulator, sid).rows)


def test_unknown_statuses_are_left_untouched(sheets_emulator: SheetsEmulator) -> None:
    odd = ["HOLD", "new?", "Neww", "skip me", "", "NEW #forged", "PROCESSING-ish"]
    queue, sid = _queue(
        sheets_emulator, [HEADER] + [[f"https://a.example/{i}", s] for i, s in enumerate(odd)]
    )
    result = queue.claim(10)
    assert result.claims == [] and result.aimed == 0
    assert [r.status_cell.raw for r in _rows(sheets_emulator, sid).rows] == odd
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] == 0


def test_formulas_are_never_evaluated_nor_written_back_as_formulas(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    queue, sid = _queue(
        sheets_emulator,
        [
            HEADER,
            ['=HYPERLINK("https://evil.example/")', "NEW"],
            ["https://a.example/1", '=IF(TRUE,"NEW","x")'],
            ["https://a.example/2", "NEW"],
        ],
        value_input_option="USER_ENTERED",
    )
    result = wake_up(queue, sqlite_ledger, 10).claim
    assert [c.url for c in result.claims] == ["https://a.example/2"]
    rows = _rows(sheets_emulator, sid).rows
    assert rows[0].status is Status.INVALID
    assert rows[0].get("reason").startswith("formula-like value is not a URL (not evaluated)")
    assert rows[1].status_cell.raw == '=IF(TRUE,"NEW","x")', "a formula status is not ours to touch"
    # values we write that look like formulas stay text (valueInputOption RAW)
    token = result.claims[0].token
    queue.write_fields(token, {"score": "=1+1", "reason": "@SUM(A1)"})
    book = sheets_emulator.server.store.get(sid)
    sheet = next(s for s in book.sheets if s.title == "queue")
    written = [sheet.get(3, 4), sheet.get(3, 2)]
    assert written == ["=1+1", "@SUM(A1)"] and not any(isinstance(c, Formula) for c in written)
    assert isinstance(sheet.get(1, 0), Formula), "the editor's own formula is kept as it was"


def test_missing_header_columns_fail_loudly_naming_them(sheets_emulator: SheetsEmulator) -> None:
    queue, _ = _queue(sheets_emulator, [["URL", "Status", "Score"], ["https://a.example/1", "NEW"]])
    with pytest.raises(MissingColumnsError, match=r"'reason', 'run_id', 'published_url'"):
        queue.claim(10)
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] == 0


@pytest.mark.parametrize("rows", [[], [HEADER]], ids=["no cells at all", "header only"])
def test_an_empty_sheet_claims_nothing_and_writes_nothing(
    sheets_emulator: SheetsEmulator, rows: list[Any]
) -> None:
    queue, _ = _queue(sheets_emulator, rows)
    result = queue.claim(10)
    assert (result.claims, result.rejected, result.aimed) == ([], [], 0)
    assert sheets_emulator.request_log.writes == 0


def test_a_sheet_of_50000_rows_is_read_in_one_call_and_claimed_in_constant_requests(
    sheets_emulator: SheetsEmulator,
) -> None:
    rows = [HEADER] + [
        [
            f"https://big.example/{i}",
            "DONE #20250101T000000Z-x" if i < 49_900 else "NEW",
            "",
            "",
            "",
            f"https://pub.example/{i}" if i < 49_900 else "",
        ]
        for i in range(50_000)
    ]
    queue, sid = _queue(sheets_emulator, rows)
    sheets_emulator.request_log.reset()
    result = queue.claim(100)
    assert len(result.claims) == 100
    counts = sheets_emulator.request_log.counts
    assert counts == {"spreadsheets.get": 1, "spreadsheets.batchUpdate": 1}, (
        counts
    )  # ids and values in one read
    assert sum(1 for r in _rows(sheets_emulator, sid).rows if r.status is Status.PROCESSING) == 100


@pytest.mark.parametrize("version", ["v 2", "v2#x", "v2/x", "", "v" * 41, "v1\n"])
def test_a_processing_version_no_run_id_can_carry_is_refused_before_any_claim(
    sheets_emulator: SheetsEmulator, version: str
) -> None:
    # The version rides in the claim token. Checked only when the run id was built, after the
    # claim batch, it left rows "PROCESSING #...-v 2" (a token the status parser cannot read, so
    # no claimer, sensor or reconciler ever touched them again) and runs never created.
    sid = sheets_emulator.create_spreadsheet(
        "articles",
        sheets={"queue": [HEADER, ["https://ok.example/a", "NEW"], ["https://ok.example/b", "NEW"]]},
    )
    transport = GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid)
    sheets_emulator.request_log.reset()
    with pytest.raises(ValueError, match="processing version must match") as refused:
        SheetQueue(transport, version=version).claim(5)
    assert repr(version) in str(refused.value)
    assert sheets_emulator.request_log.writes == 0
    assert [r.status_cell.raw for r in _rows(sheets_emulator, sid).rows] == ["NEW", "NEW"]
    assert not list(sheets_emulator.server.store.spreadsheets[sid].all_metadata())
