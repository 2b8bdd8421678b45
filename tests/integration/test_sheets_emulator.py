"""The Sheets API emulator, driven by the real google-api-python-client through Airflow's GSheetsHook.

Every call goes over HTTP to the emulator on 127.0.0.1, through the discovery document bundled with
the client (nothing reaches the network), with the anonymous ``onceflow_sheets`` connection the
``sheets_emulator`` fixture sets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from googleapiclient.errors import HttpError

from onceflow.testing.sheets_emulator.errors import ApiError

if TYPE_CHECKING:
    from pathlib import Path

    from onceflow.testing.sheets_fixtures import SheetsEmulator

QUEUE = [
    ["url", "status", "score"],
    ["https://example.com/a", "NEW", "1"],
    ["https://example.com/b", "NEW"],
    ["https://example.com/c", "DONE", "3"],
]


def _queue(emulator: SheetsEmulator, rows: list[list[Any]] | None = None, title: str = "Queue") -> str:
    return emulator.create_spreadsheet("articles", sheets={title: rows if rows is not None else QUEUE})


def _find_replace(find: str, replacement: str, **scope: Any) -> dict[str, Any]:
    return {"findReplace": {"find": find, "replacement": replacement, "matchCase": True, **scope}}


def _cell(sheet_id: int, row: int, col: int) -> dict[str, Any]:
    return {
        "range": {
            "sheetId": sheet_id,
            "startRowIndex": row,
            "endRowIndex": row + 1,
            "startColumnIndex": col,
            "endColumnIndex": col + 1,
        }
    }


def _control(emulator: SheetsEmulator, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(emulator.endpoint + path.lstrip("/"), data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


# -- reads ------------------------------------------------------------------------------------------


def test_spreadsheets_get_lists_sheets_with_grid_sizes(sheets_emulator: SheetsEmulator) -> None:
    sid = sheets_emulator.create_spreadsheet("book", sheets={"Queue": QUEUE, "Audit": []})
    hook = sheets_emulator.hook()

    book = hook.get_spreadsheet(sid)

    assert book["spreadsheetId"] == sid
    assert book["properties"]["title"] == "book"
    assert [s["properties"]["title"] for s in book["sheets"]] == ["Queue", "Audit"]
    assert [s["properties"]["sheetId"] for s in book["sheets"]] == [0, 1]
    assert book["sheets"][0]["properties"]["gridProperties"] == {"rowCount": 1000, "columnCount": 26}
    assert hook.get_sheet_titles(sid) == ["Queue", "Audit"]


def test_spreadsheets_get_with_ranges_and_a_fields_mask_gives_ids_and_cells_as_entered(
    sheets_emulator: SheetsEmulator,
) -> None:
    """Google's documented call shape for tab ids and values in one read: ``ranges`` limits the
    reply to the sheets (and parts) the ranges touch, a ``fields`` mask listing grid data returns
    it without ``includeGridData``, and keeps only the masked fields."""
    sid = sheets_emulator.create_spreadsheet("book", sheets={"Queue": [], "Audit": [["x"]]})
    service = sheets_emulator.hook().get_conn()
    body = [{"range": "Queue!A1", "values": [["url", "status", "n", "", "true"], [], ["=1+1", "", 0.5]]}]
    service.spreadsheets().values().batchUpdate(
        spreadsheetId=sid, body={"valueInputOption": "USER_ENTERED", "data": body}
    ).execute()
    mask = "sheets(properties(sheetId,title),data(rowData(values(userEnteredValue))))"

    reply = service.spreadsheets().get(spreadsheetId=sid, ranges=["Queue"], fields=mask).execute()

    entered = [{"userEnteredValue": {"stringValue": v}} for v in ("url", "status", "n")]
    assert reply == {
        "sheets": [
            {
                "properties": {"sheetId": 0, "title": "Queue"},
                "data": [
                    {
                        "rowData": [
                            {"values": [*entered, {}, {"userEnteredValue": {"boolValue": True}}]},
                            {},
                            {
                                "values": [
                                    {"userEnteredValue": {"formulaValue": "=1+1"}},
                                    {},
                                    {"userEnteredValue": {"numberValue": 0.5}},
                                ]
                            },
                        ]
                    }
                ],
            }
        ]
    }
    # a range inside the tab: its GridData starts there (zero-based; omitted when 0)
    starts = "sheets(data(startRow,startColumn,rowData(values(userEnteredValue))))"
    part = service.spreadsheets().get(spreadsheetId=sid, ranges=["Queue!B3:C3"], fields=starts).execute()
    assert part["sheets"][0]["data"] == [
        {
            "startRow": 2,
            "startColumn": 1,
            "rowData": [{"values": [{}, {"userEnteredValue": {"numberValue": 0.5}}]}],
        }
    ]
    # the mask decides: without grid data in it, includeGridData is ignored
    ids = (
        service.spreadsheets()
        .get(spreadsheetId=sid, includeGridData=True, fields="sheets.properties(sheetId,title)")
        .execute()
    )
    assert ids == {
        "sheets": [
            {"properties": {"sheetId": 0, "title": "Queue"}},
            {"properties": {"sheetId": 1, "title": "Audit"}},
        ]
    }
    # no mask: includeGridData adds every cell field and the dimension sizes
    full = (
        service.spreadsheets().get(spreadsheetId=sid, ranges=["Audit!A1:B2"], includeGridData=True).execute()
    )
    [grid] = full["sheets"][0]["data"]
    assert grid["rowData"] == [
        {
            "values": [
                {
                    "userEnteredValue": {"stringValue": "x"},
                    "effectiveValue": {"stringValue": "x"},
                    "formattedValue": "x",
                }
            ]
        }
    ]
    assert (len(grid["rowMetadata"]), len(grid["columnMetadata"])) == (2, 2)
    assert "data" not in service.spreadsheets().get(spreadsheetId=sid).execute()["sheets"][0]
    with pytest.raises(HttpError) as refused:
        service.spreadsheets().get(spreadsheetId=sid, fields="sheets(properties").execute()
    assert refused.value.resp.status == 400


def test_values_get_trims_trailing_empty_rows_and_columns(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["a", "", "c", ""], ["", ""], ["x"], ["", "", ""], []])
    service = sheets_emulator.hook().get_conn()

    reply = service.spreadsheets().values().get(spreadsheetId=sid, range="Queue!A1:F10").execute()

    assert reply == {"range": "Queue!A1:F10", "majorDimension": "ROWS", "values": [["a", "", "c"], [], ["x"]]}


def test_values_get_of_an_empty_range_has_no_values_key(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()

    reply = service.spreadsheets().values().get(spreadsheetId=sid, range="Queue!E5:F6").execute()

    assert reply == {"range": "Queue!E5:F6", "majorDimension": "ROWS"}


def test_whole_column_and_open_ranges_echo_the_grid_bound(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()
    values = service.spreadsheets().values()

    whole = values.get(spreadsheetId=sid, range="Queue!A:B").execute()
    open_ = values.get(spreadsheetId=sid, range="Queue!A2:B").execute()
    sheet = values.get(spreadsheetId=sid, range="Queue").execute()

    assert whole["range"] == "Queue!A1:B1000"
    assert whole["values"] == [r[:2] for r in QUEUE]
    assert open_["range"] == "Queue!A2:B1000"
    assert open_["values"] == [r[:2] for r in QUEUE[1:]]
    assert sheet["range"] == "Queue!A1:Z1000"
    assert sheet["values"] == QUEUE


def test_percent_encoded_ranges_with_spaces_quotes_and_colons(sheets_emulator: SheetsEmulator) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "book", sheets={"My Queue": [["a", "b"], ["c", "d"]], "Editor's: notes/1": [["n"]]}
    )
    hook = sheets_emulator.hook()

    assert hook.get_values(sid, "'My Queue'!A1:B2") == [["a", "b"], ["c", "d"]]
    assert hook.get_values(sid, "'Editor''s: notes/1'!A1") == [["n"]]
    reply = hook.update_values(sid, "'Editor''s: notes/1'!B1", [["written"]])
    assert reply["updatedRange"] == "'Editor''s: notes/1'!B1"
    assert sheets_emulator.values(sid, "'Editor''s: notes/1'!A1:B1") == [["n", "written"]]


def test_a_range_without_a_sheet_name_means_the_first_sheet(sheets_emulator: SheetsEmulator) -> None:
    sid = sheets_emulator.create_spreadsheet("book", sheets={"First": [["1"]], "Second": [["2"]]})

    assert sheets_emulator.hook().get_values(sid, "A1") == [["1"]]


def test_major_dimension_columns_transposes_and_trims(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["a", "b", ""], ["c"]])
    hook = sheets_emulator.hook()

    assert hook.get_values(sid, "Queue!A1:C3", major_dimension="COLUMNS") == [["a", "c"], ["b"]]


def test_batch_get_returns_one_value_range_per_range(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    reply = hook.batch_get_values(sid, ["Queue!A1:A2", "Queue!B:B", "Queue!Z9"])

    assert reply["spreadsheetId"] == sid
    assert reply["valueRanges"] == [
        {"range": "Queue!A1:A2", "majorDimension": "ROWS", "values": [["url"], ["https://example.com/a"]]},
        {
            "range": "Queue!B1:B1000",
            "majorDimension": "ROWS",
            "values": [["status"], ["NEW"], ["NEW"], ["DONE"]],
        },
        {"range": "Queue!Z9", "majorDimension": "ROWS"},
    ]


def test_a_sheet_of_50000_rows_reads_in_one_call(sheets_emulator: SheetsEmulator) -> None:
    rows = [["url", "status", "score", "published_url"]]
    rows += [[f"https://example.com/{i}", "NEW", str(i % 100), ""] for i in range(50_000)]
    sid = _queue(sheets_emulator, rows)
    hook = sheets_emulator.hook()

    values = hook.get_values(sid, "Queue!A:D")

    assert len(values) == 50_001
    assert values[-1] == ["https://example.com/49999", "NEW", "99"]
    assert sheets_emulator.request_log["values.get"] == 1


# -- errors -----------------------------------------------------------------------------------------


def test_unknown_spreadsheet_is_a_google_shaped_404(sheets_emulator: SheetsEmulator) -> None:
    hook = sheets_emulator.hook()

    with pytest.raises(HttpError) as caught:
        hook.get_values("no-such-spreadsheet", "A1")

    assert caught.value.status_code == 404
    assert json.loads(caught.value.content)["error"] == {
        "code": 404,
        "message": "Requested entity was not found.",
        "status": "NOT_FOUND",
    }


@pytest.mark.parametrize("bad_range", ["Nope!A1", "Queue!A0", "Queue!A1:", "Queue!ZZZZ1", "Queue!A:C5"])
def test_a_bad_range_is_a_400_invalid_argument(sheets_emulator: SheetsEmulator, bad_range: str) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        sheets_emulator.hook().get_values(sid, bad_range)

    error = json.loads(caught.value.content)["error"]
    assert caught.value.status_code == 400
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["message"] == f"Unable to parse range: {bad_range}"


@pytest.mark.parametrize("past", ["Queue!A1001", "Queue!A1001:B", "Queue!AA1:AB2"])
def test_reading_past_the_grid_is_a_400(sheets_emulator: SheetsEmulator, past: str) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        sheets_emulator.hook().get_values(sid, past)

    assert caught.value.status_code == 400
    assert "exceeds grid limits" in json.loads(caught.value.content)["error"]["message"]


# -- values.update ------------------------------------------------------------------------------------


def test_values_update_reports_what_it_updated(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    reply = hook.update_values(sid, "Queue!D1:E2", [["published_url", "note"], ["https://pub/a"]])

    assert reply == {
        "spreadsheetId": sid,
        "updatedRange": "Queue!D1:E2",
        "updatedRows": 2,
        "updatedColumns": 2,
        "updatedCells": 3,
    }
    assert sheets_emulator.values(sid, "Queue!D1:E2") == [["published_url", "note"], ["https://pub/a"]]


def test_values_update_from_a_single_cell_grows_with_the_data(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    reply = sheets_emulator.hook().update_values(sid, "Queue!B2", [["A", "B", "C"], ["D", "E", "F"]])

    assert reply["updatedRange"] == "Queue!B2:D3"
    assert reply["updatedCells"] == 6


def test_values_update_past_its_range_is_refused_and_changes_nothing(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        sheets_emulator.hook().update_values(sid, "Queue!A1:B1", [["x", "y"], ["z"]])

    assert caught.value.status_code == 400
    assert "tried writing to row [2]" in json.loads(caught.value.content)["error"]["message"]
    assert sheets_emulator.values(sid, "Queue!A1:B1") == [["url", "status"]]


@pytest.mark.parametrize(
    ("range_", "values", "message"),
    [
        (
            "Queue!A1001",
            [["x"]],
            "Range ('Queue'!A1001) exceeds grid limits. Max rows: 1000, max columns: 26",
        ),
        ("Queue!A999", [["x"], ["y"], ["z"]], "Range ('Queue'!A999:A1001) exceeds grid limits"),
        ("Queue!Z1", [["x", "y"]], "Range ('Queue'!Z1:AA1) exceeds grid limits"),
    ],
)
def test_values_update_cannot_write_past_the_grid(
    sheets_emulator: SheetsEmulator, range_: str, values: list[list[str]], message: str
) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        sheets_emulator.hook().update_values(sid, range_, values)

    assert caught.value.status_code == 400
    assert json.loads(caught.value.content)["error"]["message"].startswith(message)
    assert sheets_emulator.values(sid, "Queue!A999:A1000") == []


def test_append_grows_the_grid_where_update_cannot(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["h"]] + [[str(i)] for i in range(999)])
    hook = sheets_emulator.hook()

    reply = hook.append_values(sid, "Queue!A:A", [["1000"], ["1001"]])

    assert reply["updates"]["updatedRange"] == "Queue!A1001:A1002"
    assert hook.get_spreadsheet(sid)["sheets"][0]["properties"]["gridProperties"]["rowCount"] == 1002
    assert hook.get_values(sid, "Queue!A1001:A1002") == [["1000"], ["1001"]]


def test_null_skips_a_cell_and_empty_string_clears_it(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    sheets_emulator.hook().update_values(sid, "Queue!A2:C2", [[None, "", "9"]])

    assert sheets_emulator.values(sid, "Queue!A2:C2") == [["https://example.com/a", "", "9"]]


def test_include_values_in_response_echoes_the_written_cells(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    reply = hook.update_values(
        sid, "Queue!C2", [["42"]], value_input_option="USER_ENTERED", include_values_in_response=True
    )

    assert reply["updatedData"] == {"range": "Queue!C2", "majorDimension": "ROWS", "values": [["42"]]}


def test_values_update_with_major_dimension_columns(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [])

    reply = sheets_emulator.hook().update_values(
        sid, "Queue!A1", [["a", "b", "c"]], major_dimension="COLUMNS"
    )

    assert reply["updatedRange"] == "Queue!A1:A3"
    assert sheets_emulator.values(sid, "Queue!A1:C3") == [["a"], ["b"], ["c"]]


def test_value_input_option_is_required(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()

    with pytest.raises(HttpError) as caught:
        service.spreadsheets().values().update(
            spreadsheetId=sid, range="Queue!A1", body={"values": [["x"]]}
        ).execute()

    assert caught.value.status_code == 400


# -- RAW vs USER_ENTERED and formula-like values ------------------------------------------------------


def test_user_entered_parses_numbers_booleans_and_formulas(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [])
    hook = sheets_emulator.hook()

    hook.update_values(
        sid,
        "Queue!A1",
        [["42", "3.5", "true", "=SUM(1,2)", "'=literal", "NEW"]],
        value_input_option="USER_ENTERED",
    )

    unformatted = hook.get_values(sid, "Queue!A1:F1", value_render_option="UNFORMATTED_VALUE")
    formatted = hook.get_values(sid, "Queue!A1:F1")
    formulas = hook.get_values(sid, "Queue!A1:F1", value_render_option="FORMULA")
    assert unformatted == [[42, 3.5, True, "=SUM(1,2)", "=literal", "NEW"]]
    assert formatted == [["42", "3.5", "TRUE", "=SUM(1,2)", "=literal", "NEW"]]
    assert formulas == [[42, 3.5, True, "=SUM(1,2)", "=literal", "NEW"]]


def test_raw_stores_formula_like_text_as_a_string(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [])
    hook = sheets_emulator.hook()

    hook.update_values(sid, "Queue!A1", [["=IMPORTXML(1)", "42", "true"]], value_input_option="RAW")
    hook.update_values(sid, "Queue!A2", [["=IMPORTXML(1)"]], value_input_option="USER_ENTERED")

    assert hook.get_values(sid, "Queue!A1:C1", value_render_option="UNFORMATTED_VALUE") == [
        ["=IMPORTXML(1)", "42", "true"]
    ]
    # A formula cell and a text cell look alike when read, but only the formula is one: findReplace
    # without includeFormulas sees the text cell only.
    reply = (
        hook.get_conn()
        .spreadsheets()
        .batchUpdate(spreadsheetId=sid, body={"requests": [_find_replace("IMPORTXML", "X", sheetId=0)]})
        .execute()
    )
    assert reply["replies"][0]["findReplace"]["valuesChanged"] == 1
    assert sheets_emulator.values(sid, "Queue!A1:A2") == [["=X(1)"], ["=IMPORTXML(1)"]]


# -- spreadsheets.batchUpdate: findReplace --------------------------------------------------------------


def test_find_replace_on_one_cell_with_match_entire_cell(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()
    claim = _find_replace("NEW", "CLAIMED token-1", matchEntireCell=True, **_cell(0, 1, 1))

    first = service.spreadsheets().batchUpdate(spreadsheetId=sid, body={"requests": [claim]}).execute()
    second = service.spreadsheets().batchUpdate(spreadsheetId=sid, body={"requests": [claim]}).execute()

    assert first == {
        "spreadsheetId": sid,
        "replies": [
            {
                "findReplace": {
                    "valuesChanged": 1,
                    "rowsChanged": 1,
                    "sheetsChanged": 1,
                    "occurrencesChanged": 1,
                }
            }
        ],
    }
    assert second["replies"] == [{"findReplace": {}}]
    assert sheets_emulator.values(sid, "Queue!B2:B3") == [["CLAIMED token-1"], ["NEW"]]


def test_match_entire_cell_does_not_match_a_substring(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["status"], ["NEWS"], ["NEW"]])
    service = sheets_emulator.hook().get_conn()

    reply = (
        service.spreadsheets()
        .batchUpdate(
            spreadsheetId=sid, body={"requests": [_find_replace("NEW", "X", matchEntireCell=True, sheetId=0)]}
        )
        .execute()
    )

    assert reply["replies"][0]["findReplace"]["occurrencesChanged"] == 1
    assert sheets_emulator.values(sid, "Queue!A1:A3") == [["status"], ["NEWS"], ["X"]]


def test_find_replace_counts_occurrences_rows_and_sheets(sheets_emulator: SheetsEmulator) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "book",
        sheets={"One": [["a-a", "a"], ["b"]], "Two": [["a"]], "Three": [['=A1&"a"']]},
        value_input_option="USER_ENTERED",
    )
    service = sheets_emulator.hook().get_conn()

    reply = (
        service.spreadsheets()
        .batchUpdate(spreadsheetId=sid, body={"requests": [_find_replace("a", "z", allSheets=True)]})
        .execute()
    )

    assert reply["replies"][0]["findReplace"] == {
        "valuesChanged": 3,
        "rowsChanged": 2,
        "sheetsChanged": 2,
        "occurrencesChanged": 4,
    }
    assert sheets_emulator.values(sid, "One!A1:B1") == [["z-z", "z"]]


def test_find_replace_in_formulas_only_when_asked(sheets_emulator: SheetsEmulator) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "book", sheets={"S": [["=SUM(A2)", "SUM"]]}, value_input_option="USER_ENTERED"
    )
    service = sheets_emulator.hook().get_conn()

    reply = (
        service.spreadsheets()
        .batchUpdate(
            spreadsheetId=sid,
            body={"requests": [_find_replace("SUM", "MAX", sheetId=0, includeFormulas=True)]},
        )
        .execute()
    )

    assert reply["replies"][0]["findReplace"] == {
        "valuesChanged": 1,
        "formulasChanged": 1,
        "rowsChanged": 1,
        "sheetsChanged": 1,
        "occurrencesChanged": 2,
    }
    assert sheets_emulator.values(sid, "S!A1:B1") == [["=MAX(A2)", "MAX"]]


def test_find_replace_is_case_insensitive_unless_match_case(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["new"], ["NEW"]])
    service = sheets_emulator.hook().get_conn()
    spec = {"find": "NEW", "replacement": "X", "matchEntireCell": True, "sheetId": 0}

    exact = (
        service.spreadsheets()
        .batchUpdate(spreadsheetId=sid, body={"requests": [{"findReplace": {**spec, "matchCase": True}}]})
        .execute()
    )
    loose = (
        service.spreadsheets()
        .batchUpdate(spreadsheetId=sid, body={"requests": [{"findReplace": spec}]})
        .execute()
    )

    assert exact["replies"][0]["findReplace"]["occurrencesChanged"] == 1
    assert loose["replies"][0]["findReplace"]["occurrencesChanged"] == 1
    assert sheets_emulator.values(sid, "Queue!A1:A2") == [["X"], ["X"]]


def test_find_replace_by_regex_with_groups(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["CLAIMED abc 7"]])
    service = sheets_emulator.hook().get_conn()

    service.spreadsheets().batchUpdate(
        spreadsheetId=sid,
        body={
            "requests": [
                _find_replace(r"^CLAIMED (\w+) (\d+)$", "DONE $1 ($2)", searchByRegex=True, sheetId=0)
            ]
        },
    ).execute()

    assert sheets_emulator.values(sid, "Queue!A1") == [["DONE abc (7)"]]


def test_a_failing_request_rolls_back_the_whole_batch(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()

    with pytest.raises(HttpError) as caught:
        service.spreadsheets().batchUpdate(
            spreadsheetId=sid,
            body={"requests": [_find_replace("NEW", "GONE", sheetId=0), _find_replace("x", "y", sheetId=99)]},
        ).execute()

    assert caught.value.status_code == 400
    assert "requests[1]" in json.loads(caught.value.content)["error"]["message"]
    assert sheets_emulator.values(sid, "Queue!B2:B3") == [["NEW"], ["NEW"]]


# -- atomicity under real races -------------------------------------------------------------------------

_CLAIMER = textwrap.dedent(
    """
    import json, os, sys, time
    from google.auth.credentials import AnonymousCredentials
    from googleapiclient.discovery import build

    # The bare client (what GSheetsHook builds) keeps the start-up of four processes short.
    endpoint, sid, token, go_file = sys.argv[1:5]
    service = build(
        "sheets", "v4", credentials=AnonymousCredentials(), cache_discovery=False,
        client_options={"api_endpoint": endpoint},
    )
    service.spreadsheets().get(spreadsheetId=sid).execute()  # connect before the start line
    print("ready", flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.001)
    cell = {"sheetId": 0, "startRowIndex": 1, "endRowIndex": 2, "startColumnIndex": 1, "endColumnIndex": 2}
    body = {"requests": [{"findReplace": {
        "find": "NEW", "replacement": "CLAIMED " + token, "matchCase": True, "matchEntireCell": True,
        "range": cell,
    }}]}
    reply = service.spreadsheets().batchUpdate(spreadsheetId=sid, body=body).execute(num_retries=0)
    print(json.dumps(reply["replies"][0]["findReplace"].get("occurrencesChanged", 0)), flush=True)
    """
)


def test_exactly_one_of_8_threads_and_4_processes_claims_a_cell(
    sheets_emulator: SheetsEmulator, tmp_path: Path
) -> None:
    sid = _queue(sheets_emulator)
    go_file = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, sheets_emulator.endpoint, sid, f"proc-{i}", str(go_file)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for i in range(4)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        barrier = threading.Barrier(8 + 1)
        results: dict[str, int] = {}

        def claim(token: str) -> None:
            service = sheets_emulator.hook().get_conn()
            service.spreadsheets().get(spreadsheetId=sid).execute()
            request = service.spreadsheets().batchUpdate(
                spreadsheetId=sid,
                body={
                    "requests": [
                        _find_replace("NEW", f"CLAIMED {token}", matchEntireCell=True, **_cell(0, 1, 1))
                    ]
                },
            )
            barrier.wait()
            reply = request.execute(num_retries=0)
            results[token] = reply["replies"][0]["findReplace"].get("occurrencesChanged", 0)

        threads = [threading.Thread(target=claim, args=(f"thread-{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        barrier.wait()
        go_file.touch()
        for t in threads:
            t.join(timeout=60)
        for i, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0
            results[f"proc-{i}"] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()

    winners = [token for token, changed in results.items() if changed == 1]
    assert len(results) == 12
    assert len(winners) == 1
    assert sum(results.values()) == 1
    assert sheets_emulator.values(sid, "Queue!B2") == [[f"CLAIMED {winners[0]}"]]
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] == 12


def test_a_long_request_is_applied_as_one_step_against_concurrent_ones(
    sheets_emulator: SheetsEmulator,
) -> None:
    # Each findReplace scans 20,000 cells, far longer than a thread switch: without the lock the
    # scans interleave and the column ends up with several tokens (checked by removing the lock).
    sid = _queue(sheets_emulator, [["status"]] + [["NEW"] for _ in range(20_000)])
    barrier = threading.Barrier(8)
    results: dict[int, int] = {}

    def claim_all(writer: int) -> None:
        service = sheets_emulator.hook().get_conn()
        request = service.spreadsheets().batchUpdate(
            spreadsheetId=sid,
            body={"requests": [_find_replace("NEW", f"CLAIMED {writer}", matchEntireCell=True, sheetId=0)]},
        )
        barrier.wait()
        reply = request.execute(num_retries=0)
        results[writer] = reply["replies"][0]["findReplace"].get("occurrencesChanged", 0)

    threads = [threading.Thread(target=claim_all, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert sorted(results.values()) == [0] * 7 + [20_000]
    winner = max(results, key=lambda w: results[w])
    assert {row[0] for row in sheets_emulator.values(sid, "Queue!A2:A")} == {f"CLAIMED {winner}"}


# -- request log --------------------------------------------------------------------------------------


def test_the_request_log_counts_calls_per_method(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    hook.get_values(sid, "Queue!A:C")
    hook.get_values(sid, "Queue!A1")
    hook.batch_get_values(sid, ["Queue!A1", "Queue!B1"])
    hook.update_values(sid, "Queue!D1", [["x"]])

    assert sheets_emulator.request_log.counts == {"values.get": 2, "values.batchGet": 1, "values.update": 1}
    assert (sheets_emulator.request_log.reads, sheets_emulator.request_log.writes) == (3, 1)
    over_http = _control(sheets_emulator, "GET", "/_emulator/requests")
    assert over_http["counts"] == {"values.get": 2, "values.batchGet": 1, "values.update": 1}
    assert over_http["total"] == 4

    _control(sheets_emulator, "DELETE", "/_emulator/requests")
    assert sheets_emulator.request_log.total == 0


# -- values.batchUpdate, append, clear ------------------------------------------------------------------


def test_values_batch_update_writes_every_range_and_totals(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    reply = hook.batch_update_values(
        sid,
        ranges=["Queue!B2", "Queue!D2:E3"],
        values=[[["CLAIMED t"]], [["x", "y"], ["z"]]],
        include_values_in_response=True,
    )

    assert reply["totalUpdatedRows"] == 2  # rows 2 and 3: row 2 counts once though two ranges wrote it
    assert reply["totalUpdatedColumns"] == 3
    assert reply["totalUpdatedCells"] == 4
    assert reply["totalUpdatedSheets"] == 1
    assert [r["updatedRange"] for r in reply["responses"]] == ["Queue!B2", "Queue!D2:E3"]
    assert reply["responses"][1]["updatedData"]["values"] == [["x", "y"], ["z"]]
    assert sheets_emulator.values(sid, "Queue!B2:E3") == [["CLAIMED t", "1", "x", "y"], ["NEW", "", "z"]]


def test_values_batch_update_is_all_or_nothing(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        sheets_emulator.hook().batch_update_values(
            sid, ranges=["Queue!B2", "Nope!A1"], values=[[["CLAIMED t"]], [["x"]]]
        )

    assert caught.value.status_code == 400
    assert sheets_emulator.values(sid, "Queue!B2") == [["NEW"]]


def test_append_overwrite_lands_after_the_last_row_of_the_table(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["url", "status"], ["a", "NEW"], ["b", "NEW"], [], [], ["far", "away"]])
    hook = sheets_emulator.hook()

    # the range touches only the first table; a range reaching row 6 would take the second one
    reply = hook.append_values(sid, "Queue!A1:B3", [["c", "NEW"]])

    assert reply == {
        "spreadsheetId": sid,
        "tableRange": "Queue!A1:B3",
        "updates": {
            "spreadsheetId": sid,
            "updatedRange": "Queue!A4:B4",
            "updatedRows": 1,
            "updatedColumns": 2,
            "updatedCells": 2,
        },
    }
    assert sheets_emulator.values(sid, "Queue!A4:B6") == [["c", "NEW"], [], ["far", "away"]]


def test_append_insert_rows_pushes_the_rows_below_down(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["url", "status"], ["a", "NEW"], [], ["below", "x"]])
    hook = sheets_emulator.hook()
    rows_before = hook.get_spreadsheet(sid)["sheets"][0]["properties"]["gridProperties"]["rowCount"]

    reply = hook.append_values(
        sid, "Queue!A1:B1", [["b", "NEW"], ["c", "NEW"]], insert_data_option="INSERT_ROWS"
    )

    assert reply["updates"]["updatedRange"] == "Queue!A3:B4"
    assert sheets_emulator.values(sid, "Queue!A1:B6") == [
        ["url", "status"],
        ["a", "NEW"],
        ["b", "NEW"],
        ["c", "NEW"],
        [],
        ["below", "x"],
    ]
    rows_after = hook.get_spreadsheet(sid)["sheets"][0]["properties"]["gridProperties"]["rowCount"]
    assert rows_after == rows_before + 2


def test_append_starts_at_the_first_column_of_the_table(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["", "h1", "h2"], ["", "v1", "v2"]])

    reply = sheets_emulator.hook().append_values(sid, "Queue!A:E", [["n1", "n2"]])

    assert reply["tableRange"] == "Queue!B1:C2"
    assert reply["updates"]["updatedRange"] == "Queue!B3:C3"


def test_append_to_an_empty_sheet_starts_at_the_range(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [])

    reply = sheets_emulator.hook().append_values(
        sid, "Queue!B2", [["first"]], include_values_in_response=True
    )

    assert "tableRange" not in reply
    assert reply["updates"]["updatedRange"] == "Queue!B2"
    assert reply["updates"]["updatedData"]["values"] == [["first"]]


def test_concurrent_appends_lose_no_row(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator, [["writer", "n"]])
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def append(writer: int) -> None:
        try:
            hook = sheets_emulator.hook()
            barrier.wait()
            for n in range(10):
                hook.append_values(
                    sid, "Queue!A:B", [[f"w{writer}", str(n)]], insert_data_option="INSERT_ROWS"
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    rows = sheets_emulator.values(sid, "Queue!A2:B")
    assert sorted(map(tuple, rows)) == sorted((f"w{w}", str(n)) for w in range(8) for n in range(10))


def test_values_clear_and_batch_clear(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    cleared = hook.clear(sid, "Queue!C:C")
    batch = hook.batch_clear(sid, ["Queue!A4:B4", "Queue!B2"])

    assert cleared == {"spreadsheetId": sid, "clearedRange": "Queue!C1:C1000"}
    assert batch == {"spreadsheetId": sid, "clearedRanges": ["Queue!A4:B4", "Queue!B2"]}
    assert hook.get_values(sid, "Queue!A:C") == [
        ["url", "status"],
        ["https://example.com/a"],
        ["https://example.com/b", "NEW"],
    ]


# -- spreadsheets.batchUpdate: rows, sheets, cells --------------------------------------------------------


def _batch(sheets_emulator: SheetsEmulator, sid: str, *requests: dict[str, Any]) -> dict[str, Any]:
    service = sheets_emulator.hook().get_conn()
    return service.spreadsheets().batchUpdate(spreadsheetId=sid, body={"requests": list(requests)}).execute()  # type: ignore[no-any-return]


def _rows(sheet_id: int, start: int, end: int) -> dict[str, Any]:
    return {"range": {"sheetId": sheet_id, "dimension": "ROWS", "startIndex": start, "endIndex": end}}


def test_insert_and_delete_rows_move_the_rows_below(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    inserted = _batch(sheets_emulator, sid, {"insertDimension": _rows(0, 1, 3)})
    assert inserted["replies"] == [{}]
    assert sheets_emulator.values(sid, "Queue!A1:A5") == [
        ["url"],
        [],
        [],
        ["https://example.com/a"],
        ["https://example.com/b"],
    ]

    _batch(sheets_emulator, sid, {"deleteDimension": _rows(0, 1, 4)})
    assert sheets_emulator.values(sid, "Queue!A:A") == [
        ["url"],
        ["https://example.com/b"],
        ["https://example.com/c"],
    ]
    book = sheets_emulator.hook().get_spreadsheet(sid)
    assert book["sheets"][0]["properties"]["gridProperties"]["rowCount"] == 999


def test_deleting_every_row_is_refused(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        _batch(sheets_emulator, sid, {"deleteDimension": _rows(0, 0, 1000)})

    assert caught.value.status_code == 400
    assert sheets_emulator.values(sid, "Queue!A1") == [["url"]]


def test_add_sheet_creates_an_audit_tab_to_append_to(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()

    reply = _batch(sheets_emulator, sid, {"addSheet": {"properties": {"title": "Audit Log"}}})
    hook.append_values(sid, "'Audit Log'!A:C", [["time", "row", "reason"]])
    hook.append_values(sid, "'Audit Log'!A:C", [["t1", "7", "re-driven"]])

    assert reply["replies"][0]["addSheet"]["properties"] == {
        "sheetId": 1,
        "title": "Audit Log",
        "index": 1,
        "sheetType": "GRID",
        "gridProperties": {"rowCount": 1000, "columnCount": 26},
    }
    assert hook.get_values(sid, "'Audit Log'!A:C") == [["time", "row", "reason"], ["t1", "7", "re-driven"]]
    with pytest.raises(HttpError) as caught:
        _batch(sheets_emulator, sid, {"addSheet": {"properties": {"title": "Audit Log"}}})
    assert "already exists" in json.loads(caught.value.content)["error"]["message"]


def test_update_cells_and_append_cells(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    def row(*values: dict[str, Any]) -> dict[str, Any]:
        return {"values": [{"userEnteredValue": v} for v in values]}

    _batch(
        sheets_emulator,
        sid,
        {
            "updateCells": {
                "start": {"sheetId": 0, "rowIndex": 1, "columnIndex": 3},
                "rows": [row({"stringValue": "pub"}, {"numberValue": 2}, {"formulaValue": "=1"})],
                "fields": "userEnteredValue",
            }
        },
        {
            "appendCells": {
                "sheetId": 0,
                "rows": [row({"stringValue": "https://example.com/d"}, {"boolValue": True})],
                "fields": "*",
            }
        },
    )

    assert sheets_emulator.values(sid, "Queue!D2:F2") == [["pub", 2, "=1"]]
    assert sheets_emulator.values(sid, "Queue!A5:B5") == [["https://example.com/d", True]]


def test_an_unsupported_request_kind_is_a_clear_400(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        _batch(sheets_emulator, sid, {"mergeCells": {}})

    assert caught.value.status_code == 400
    assert "mergeCells is not supported" in json.loads(caught.value.content)["error"]["message"]


# -- whole rows and columns, majorDimension, append's tables, batch totals, sheet properties ---------


def test_whole_row_ranges_and_a_cell_to_the_end_of_its_row(sheets_emulator: SheetsEmulator) -> None:
    """``A1:1`` runs from A1 to the end of row 1, ``2:3`` is whole rows, ``A3:A`` a column from row 3:
    each is read, echoed with the grid's bounds and written like Google's A1 notation says."""
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()
    values = service.spreadsheets().values()

    header = values.get(spreadsheetId=sid, range="Queue!A1:1").execute()
    tail = values.get(spreadsheetId=sid, range="Queue!B2:3").execute()
    rows = values.get(spreadsheetId=sid, range="Queue!2:3").execute()
    first_sheet = values.get(spreadsheetId=sid, range="1:2").execute()
    column = values.get(spreadsheetId=sid, range="Queue!A3:A").execute()
    written = values.update(
        spreadsheetId=sid, range="Queue!B6:6", valueInputOption="RAW", body={"values": [["x", "y"]]}
    ).execute()

    assert header == {"range": "Queue!A1:Z1", "majorDimension": "ROWS", "values": [QUEUE[0]]}
    assert tail == {"range": "Queue!B2:Z3", "majorDimension": "ROWS", "values": [["NEW", "1"], ["NEW"]]}
    assert rows["range"] == "Queue!A2:Z3"
    assert rows["values"] == QUEUE[1:3]
    assert first_sheet["range"] == "Queue!A1:Z2"
    assert column["range"] == "Queue!A3:A1000"
    assert column["values"] == [["https://example.com/b"], ["https://example.com/c"]]
    assert written["updatedRange"] == "Queue!B6:C6"
    assert sheets_emulator.values(sid, "Queue!A6:C6") == [["", "x", "y"]]


def test_an_absent_or_null_major_dimension_means_rows(sheets_emulator: SheetsEmulator) -> None:
    """Google's ValueRange: ``majorDimension`` unset means ROWS. A body's ``null`` is unset too:
    values.update, values.batchUpdate and values.append take ``[["a", "b"]]`` as one row."""
    sid = _queue(sheets_emulator, [])
    service = sheets_emulator.hook().get_conn()
    values = service.spreadsheets().values()
    row = {"values": [["a", "b"]], "majorDimension": None}

    update = values.update(spreadsheetId=sid, range="Queue!A1", valueInputOption="RAW", body=row).execute()
    batch = values.batchUpdate(
        spreadsheetId=sid, body={"valueInputOption": "RAW", "data": [{"range": "Queue!A2", **row}]}
    ).execute()
    append = values.append(spreadsheetId=sid, range="Queue!A1", valueInputOption="RAW", body=row).execute()
    unset = values.get(spreadsheetId=sid, range="Queue!A1:B3").execute()
    unspecified = values.batchGet(
        spreadsheetId=sid, ranges=["Queue!A1:B1"], majorDimension="DIMENSION_UNSPECIFIED"
    ).execute()

    assert update["updatedRange"] == "Queue!A1:B1"
    assert batch["responses"][0]["updatedRange"] == "Queue!A2:B2"
    assert append["updates"]["updatedRange"] == "Queue!A3:B3"
    assert unset == {"range": "Queue!A1:B3", "majorDimension": "ROWS", "values": [["a", "b"]] * 3}
    assert unspecified["valueRanges"][0]["majorDimension"] == "ROWS"


# Google's values guide explains table detection on this sheet: two tables, A1:C2 and B4:D6.
TWO_TABLES = [["x", "y", "z"], ["x", "y", "z"], [], ["", "x", "y"], ["", "", "y", "z"], ["", "x", "y", "z"]]


@pytest.mark.parametrize(
    ("range_", "table", "appended"),
    [
        ("Queue", "Queue!B4:D6", "Queue!B7:C7"),  # the whole sheet: its last table
        ("Queue!A:E", "Queue!B4:D6", "Queue!B7:C7"),
        ("Queue!B4", "Queue!B4:D6", "Queue!B7:C7"),  # a cell of the table
        ("Queue!C5:D5", "Queue!B4:D6", "Queue!B7:C7"),
        ("Queue!B2:D4", "Queue!B4:D6", "Queue!B7:C7"),  # meets both tables: the last one, all of it
        ("Queue!A3:G10", "Queue!B4:D6", "Queue!B7:C7"),  # holds the table
        ("Queue!A1", "Queue!A1:C2", "Queue!A3:B3"),  # in the first table: written over empty row 3
        ("Queue!E4", None, "Queue!E4:F4"),  # empty, in no table: written where the range starts
        ("Queue!A4", None, "Queue!A4:B4"),  # empty though beside B4: in no table either
    ],
)
def test_append_finds_the_table_as_google_documents(
    sheets_emulator: SheetsEmulator, range_: str, table: str | None, appended: str
) -> None:
    """values.append picks the last table the range meets, the whole table even where it reaches
    outside the range, writes from the row after it in the table's first column, and reports the
    table as ``tableRange`` (absent when there is none) and the appended cells as ``updates``."""
    sid = _queue(sheets_emulator, TWO_TABLES)

    reply = sheets_emulator.hook().append_values(sid, range_, [["n1", "n2"]])

    expected: dict[str, Any] = {"spreadsheetId": sid}
    if table is not None:
        expected["tableRange"] = table
    expected["updates"] = {
        "spreadsheetId": sid,
        "updatedRange": appended,
        "updatedRows": 1,
        "updatedColumns": 2,
        "updatedCells": 2,
    }
    assert reply == expected
    assert sheets_emulator.values(sid, appended) == [["n1", "n2"]]


def test_append_counts_the_cells_it_wrote_not_the_table(sheets_emulator: SheetsEmulator) -> None:
    """``updates`` is the appended range: a ``null`` cell is skipped (not counted, still inside
    ``updatedRange``); an empty row inside the data counts no row."""
    sid = _queue(sheets_emulator, TWO_TABLES)

    reply = sheets_emulator.hook().append_values(sid, "Queue", [["n1", None, "n3"], [], ["m1"]])

    assert reply["tableRange"] == "Queue!B4:D6"
    assert reply["updates"] == {
        "spreadsheetId": sid,
        "updatedRange": "Queue!B7:D9",
        "updatedRows": 2,
        "updatedColumns": 2,
        "updatedCells": 3,
    }


def test_values_batch_update_totals_count_each_row_column_cell_and_sheet_once(
    sheets_emulator: SheetsEmulator,
) -> None:
    """BatchUpdateValuesResponse counts the rows, columns and sheets where at least one cell was
    updated, across the batch: two ranges over one row make one row; each ``responses[]`` entry
    keeps its own counts."""
    sid = sheets_emulator.create_spreadsheet("book", sheets={"Queue": QUEUE, "Audit": []})

    reply = sheets_emulator.hook().batch_update_values(
        sid,
        ranges=["Queue!B2:C2", "Queue!C2:D3", "Audit!A1"],
        values=[[["x", "y"]], [["p", "q"], ["r"]], [["a"]]],
    )

    assert [
        (r["updatedRange"], r["updatedRows"], r["updatedColumns"], r["updatedCells"])
        for r in reply["responses"]
    ] == [
        ("Queue!B2:C2", 1, 2, 2),
        ("Queue!C2:D3", 2, 2, 3),
        ("Audit!A1", 1, 1, 1),
    ]
    # Queue rows 2, 3 and Audit row 1; Queue B, C, D and Audit A; Queue B2, C2, D2, C3 and Audit A1
    assert {k: v for k, v in reply.items() if k.startswith("total")} == {
        "totalUpdatedRows": 3,
        "totalUpdatedColumns": 4,
        "totalUpdatedCells": 5,
        "totalUpdatedSheets": 2,
    }
    assert sheets_emulator.values(sid, "Queue!B2:D3") == [["x", "p", "q"], ["NEW", "r"]]


def _props(sheet_id: int, fields: str, **properties: Any) -> dict[str, Any]:
    return {"updateSheetProperties": {"properties": {"sheetId": sheet_id, **properties}, "fields": fields}}


def test_update_sheet_properties_renames_resizes_freezes_and_hides(sheets_emulator: SheetsEmulator) -> None:
    """Only the fields in the mask change; the renamed tab answers to its new title and no longer to
    the old one; the properties survive a restart."""
    sid = sheets_emulator.create_spreadsheet("book", sheets={"Queue": QUEUE, "Audit": [["a"]]})
    hook = sheets_emulator.hook()

    reply = _batch(
        sheets_emulator,
        sid,
        _props(
            0,
            "title,gridProperties.frozenRowCount,gridProperties.columnCount",
            title="Articles",
            gridProperties={"frozenRowCount": 1, "columnCount": 8, "rowCount": 5},  # rowCount not in mask
            hidden=True,  # not in the mask either
        ),
        _props(1, "hidden", hidden=True),
    )
    sheets_emulator.restart()

    assert reply["replies"] == [{}, {}]
    props = [s["properties"] for s in hook.get_spreadsheet(sid)["sheets"]]
    assert props == [
        {
            "sheetId": 0,
            "title": "Articles",
            "index": 0,
            "sheetType": "GRID",
            "gridProperties": {"rowCount": 1000, "columnCount": 8, "frozenRowCount": 1},
        },
        {
            "sheetId": 1,
            "title": "Audit",
            "index": 1,
            "sheetType": "GRID",
            "gridProperties": {"rowCount": 1000, "columnCount": 26},
            "hidden": True,
        },
    ]
    assert hook.get_values(sid, "Articles!A1:C2") == QUEUE[:2]
    assert hook.get_values(sid, "Articles!A:H")[0] == QUEUE[0]  # the grid is 8 columns wide now
    with pytest.raises(HttpError) as old_title:
        hook.get_values(sid, "Queue!A1")
    assert json.loads(old_title.value.content)["error"]["message"] == "Unable to parse range: Queue!A1"


def test_renaming_a_tab_to_a_title_in_use_is_a_400_and_changes_nothing(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid = sheets_emulator.create_spreadsheet("book", sheets={"Queue": QUEUE, "Audit": []})

    with pytest.raises(HttpError) as caught:
        _batch(sheets_emulator, sid, _props(1, "title", title="Log"), _props(0, "title", title="log"))

    assert caught.value.status_code == 400
    assert json.loads(caught.value.content)["error"] == {
        "code": 400,
        "message": (
            'Invalid requests[1].updateSheetProperties: A sheet with the name "log" already exists. '
            "Please enter another name."
        ),
        "status": "INVALID_ARGUMENT",
    }
    assert sheets_emulator.hook().get_sheet_titles(sid) == ["Queue", "Audit"]  # requests[0] rolled back


@pytest.mark.parametrize(
    ("sheet_id", "index", "order"),
    [
        (0, 2, ["S2", "S1", "S3"]),  # "before the move": ahead of the third tab
        (0, 3, ["S2", "S3", "S1"]),
        (0, 99, ["S2", "S3", "S1"]),
        (2, 0, ["S3", "S1", "S2"]),
        (1, 2, ["S1", "S2", "S3"]),  # its own index + 1: nothing moves
        (1, None, ["S1", "S3", "S2"]),  # "index" in the mask but not given: to the end
    ],
)
def test_update_sheet_properties_moves_a_tab_counting_before_the_move(
    sheets_emulator: SheetsEmulator, sheet_id: int, index: int | None, order: list[str]
) -> None:
    sid = sheets_emulator.create_spreadsheet("book", sheets={"S1": [], "S2": [], "S3": []})
    given = {} if index is None else {"index": index}

    _batch(sheets_emulator, sid, _props(sheet_id, "index", **given))

    book = sheets_emulator.hook().get_spreadsheet(sid)
    assert [s["properties"]["title"] for s in book["sheets"]] == order
    assert [s["properties"]["index"] for s in book["sheets"]] == [0, 1, 2]


def test_update_sheet_properties_star_sets_every_field_absent_ones_to_their_default(
    sheets_emulator: SheetsEmulator,
) -> None:
    """``fields="*"`` updates every field: what ``properties`` leaves out goes back to its default
    (no frozen rows, not hidden, the tab moved to the end), and a smaller grid drops the cells past it."""
    sid = sheets_emulator.create_spreadsheet("book", sheets={"Queue": QUEUE, "Audit": []})
    _batch(
        sheets_emulator, sid, _props(0, "gridProperties.frozenRowCount", gridProperties={"frozenRowCount": 1})
    )

    _batch(
        sheets_emulator,
        sid,
        _props(0, "*", title="Queue2", gridProperties={"rowCount": 3, "columnCount": 2}),
    )

    hook = sheets_emulator.hook()
    props = [s["properties"] for s in hook.get_spreadsheet(sid)["sheets"]]
    assert props[1] == {
        "sheetId": 0,
        "title": "Queue2",
        "index": 1,
        "sheetType": "GRID",
        "gridProperties": {"rowCount": 3, "columnCount": 2},
    }
    assert hook.get_values(sid, "Queue2") == [r[:2] for r in QUEUE[:3]]
    with pytest.raises(HttpError) as past:
        hook.get_values(sid, "Queue2!A4")
    assert "exceeds grid limits" in json.loads(past.value.content)["error"]["message"]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_props(0, "", title="x"), "At least one field must be updated"),
        (
            _props(0, "tabColor", tabColor={"red": 1}),
            "'tabColor': is not supported by the onceflow Sheets emulator",
        ),
        (_props(0, "colour"), "'colour': is not a field of it"),
        (_props(0, "gridProperties.frozenRowCount", gridProperties={"frozenRowCount": 1000}), "freeze all"),
        (_props(0, "hidden", hidden=True), "You can't hide all the sheets"),
        (_props(0, "title", title=""), "title must not be empty"),
        (_props(7, "title", title="x"), "No grid with id: 7"),
    ],
)
def test_update_sheet_properties_refuses_what_google_refuses(
    sheets_emulator: SheetsEmulator, request_: dict[str, Any], message: str
) -> None:
    sid = _queue(sheets_emulator)

    with pytest.raises(HttpError) as caught:
        _batch(sheets_emulator, sid, request_)

    assert caught.value.status_code == 400
    error = json.loads(caught.value.content)["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["message"].startswith("Invalid requests[0]")
    assert message in error["message"]


# -- faults -----------------------------------------------------------------------------------------------


def test_429_carries_retry_after_and_resource_exhausted(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    sheets_emulator.faults.add("429", count=1, retry_after=7)
    service = sheets_emulator.hook().get_conn()

    with pytest.raises(HttpError) as caught:
        service.spreadsheets().values().get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)

    assert caught.value.status_code == 429
    assert caught.value.resp["retry-after"] == "7"
    assert json.loads(caught.value.content)["error"]["status"] == "RESOURCE_EXHAUSTED"
    # The fault was for one request only.
    assert service.spreadsheets().values().get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)


def test_the_client_retries_through_429s(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    sheets_emulator.faults.add("429", count=2, retry_after=1, methods=["values.get"])

    values = sheets_emulator.hook().get_values(sid, "Queue!A1:B1")

    assert values == [["url", "status"]]
    assert sheets_emulator.request_log["values.get"] == 3
    assert sheets_emulator.request_log.snapshot()["faults"] == {"429": 2}


def test_faults_are_armed_over_http_and_filtered_by_method(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    armed = _control(
        sheets_emulator,
        "POST",
        "/_emulator/faults",
        {"kind": "500", "count": 1, "methods": ["values.update"]},
    )
    assert armed["faults"][0]["kind"] == "500"
    service = sheets_emulator.hook().get_conn()

    assert service.spreadsheets().values().get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)
    with pytest.raises(HttpError) as caught:
        service.spreadsheets().values().update(
            spreadsheetId=sid, range="Queue!B2", valueInputOption="RAW", body={"values": [["X"]]}
        ).execute(num_retries=0)

    assert caught.value.status_code == 500
    assert sheets_emulator.values(sid, "Queue!B2") == [["NEW"]]  # a plain 500 applies nothing
    assert _control(sheets_emulator, "GET", "/_emulator/faults") == {"faults": []}


def test_apply_then_fail_lands_the_write_and_makes_the_retry_ambiguous(
    sheets_emulator: SheetsEmulator,
) -> None:
    sid = _queue(sheets_emulator)
    sheets_emulator.faults.add("apply_then_fail", count=1, methods=["spreadsheets.batchUpdate"])
    service = sheets_emulator.hook().get_conn()
    claim = service.spreadsheets().batchUpdate(
        spreadsheetId=sid,
        body={"requests": [_find_replace("NEW", "CLAIMED mine", matchEntireCell=True, **_cell(0, 1, 1))]},
    )

    # The client's automatic retry repeats the findReplace: the first attempt won, but the reply the
    # caller sees says nothing changed. Only reading the cell back tells the truth.
    reply = claim.execute(num_retries=1)

    assert reply["replies"] == [{"findReplace": {}}]
    assert sheets_emulator.values(sid, "Queue!B2") == [["CLAIMED mine"]]
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] == 2
    assert sheets_emulator.request_log.snapshot()["faults"] == {"apply_then_fail": 1}


def test_apply_then_fail_without_retry_is_a_500_after_the_write(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    sheets_emulator.faults.add("apply_then_fail", count=1)

    with pytest.raises(HttpError) as caught:
        sheets_emulator.hook().get_conn().spreadsheets().values().update(
            spreadsheetId=sid, range="Queue!B2", valueInputOption="RAW", body={"values": [["X"]]}
        ).execute(num_retries=0)

    assert caught.value.status_code == 500
    assert sheets_emulator.values(sid, "Queue!B2") == [["X"]]


def test_probabilistic_faults_repeat_with_the_same_seed(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    service = sheets_emulator.hook().get_conn()

    def pattern() -> list[int]:
        sheets_emulator.faults.clear()
        sheets_emulator.faults.add("500", probability=0.5, seed=42)
        statuses = []
        for _ in range(20):
            try:
                service.spreadsheets().values().get(spreadsheetId=sid, range="Queue!A1").execute(
                    num_retries=0
                )
                statuses.append(200)
            except HttpError as exc:
                statuses.append(exc.status_code)
        return statuses

    first, second = pattern(), pattern()

    assert first == second
    assert set(first) == {200, 500}


def test_latency_fault_delays_but_does_not_fail(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    rule = sheets_emulator.faults.add("latency", latency=0.2, count=2)

    assert sheets_emulator.hook().get_values(sid, "Queue!A1") == [["url"]]
    assert rule.fired == 1
    assert sheets_emulator.request_log.snapshot()["faults"] == {}


def test_a_quota_answers_429_with_the_wait_until_the_window_frees(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    _control(sheets_emulator, "POST", "/_emulator/quota", {"reads_per_minute": 2, "writes_per_minute": 1})
    values = sheets_emulator.hook().get_conn().spreadsheets().values()

    values.get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)
    values.get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)
    values.update(
        spreadsheetId=sid, range="Queue!D1", valueInputOption="RAW", body={"values": [["x"]]}
    ).execute(num_retries=0)
    with pytest.raises(HttpError) as caught:
        values.get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)

    assert caught.value.status_code == 429
    assert 55 <= int(caught.value.resp["retry-after"]) <= 60
    assert "Read requests" in json.loads(caught.value.content)["error"]["message"]
    assert sheets_emulator.request_log.snapshot()["faults"] == {"quota": 1}
    _control(sheets_emulator, "DELETE", "/_emulator/quota")
    assert values.get(spreadsheetId=sid, range="Queue!A1").execute(num_retries=0)


# -- persistence --------------------------------------------------------------------------------------------


def test_state_survives_a_restart_even_for_a_client_connected_before(sheets_emulator: SheetsEmulator) -> None:
    sid = _queue(sheets_emulator)
    hook = sheets_emulator.hook()
    hook.update_values(sid, "Queue!B2", [["CLAIMED t"]])
    hook.update_values(sid, "Queue!A5", [["=1+1"]], value_input_option="USER_ENTERED")

    sheets_emulator.restart()

    assert hook.get_values(sid, "Queue!B2:B3") == [["CLAIMED t"], ["NEW"]]
    assert hook.get_values(sid, "Queue!A5", value_render_option="FORMULA") == [["=1+1"]]
    # The formula is still a formula after the reload: includeFormulas finds it.
    reply = _batch(sheets_emulator, sid, _find_replace("=1+1", "=2+2", sheetId=0, includeFormulas=True))
    assert reply["replies"][0]["findReplace"]["formulasChanged"] == 1


def _start_cli(state: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceflow.testing.sheets_emulator",
            "--port",
            "0",
            "--state",
            str(state),
            *args,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        proc.wait(timeout=30)
        pytest.fail(f"the emulator did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def test_the_command_line_server_keeps_state_across_kill_9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.google.suite.hooks.sheets import GSheetsHook

    from onceflow.testing.sheets_fixtures import connection_json

    state = tmp_path / "state.json"
    seed = tmp_path / "seed.json"
    seed.write_text(
        json.dumps({"spreadsheetId": "seeded", "title": "s", "sheets": {"Queue": [["from seed"]]}})
    )
    proc, endpoint = _start_cli(state, "--seed", str(seed))
    try:
        monkeypatch.setenv("AIRFLOW_CONN_SHEETS_CLI", connection_json(endpoint))
        hook = GSheetsHook(gcp_conn_id="sheets_cli", api_endpoint=endpoint)
        sid = hook.create_spreadsheet(
            {"properties": {"title": "cli"}, "sheets": [{"properties": {"title": "Queue"}}]}
        )["spreadsheetId"]
        hook.update_values(sid, "Queue!A1", [["url", "status"], ["u", "NEW"]])
        hook.update_values("seeded", "Queue!B1", [["written"]])
    finally:
        proc.kill()
        proc.wait(timeout=30)

    # The seed is skipped now: the state already has that spreadsheet, with the later write.
    proc, endpoint = _start_cli(state, "--seed", str(seed))
    try:
        hook = GSheetsHook(gcp_conn_id="sheets_cli", api_endpoint=endpoint)
        assert hook.get_values(sid, "Queue!A:B") == [["url", "status"], ["u", "NEW"]]
        assert hook.get_values("seeded", "Queue!A1:B1") == [["from seed", "written"]]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_an_in_memory_emulator_from_the_factory_forgets_on_restart(
    sheets_emulator_factory: Any,
) -> None:
    emulator = sheets_emulator_factory(state=None)
    sid = emulator.create_spreadsheet("t", sheets={"Queue": [["x"]]})
    assert emulator.values(sid, "Queue!A1") == [["x"]]

    emulator.restart()

    with pytest.raises(ApiError) as caught:
        emulator.values(sid, "Queue!A1")
    assert caught.value.code == 404
