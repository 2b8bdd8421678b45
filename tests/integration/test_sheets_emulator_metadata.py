"""Developer metadata in the Sheets API emulator, through the real google-api-python-client.

Row-anchored metadata must follow its row through inserts, deletes and sorts (and vanish with a
deleted row), because the sheet queue writes by metadata lookup instead of by position.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
from googleapiclient.errors import HttpError

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

KEY = "onceflow.claim"
ROWS = [
    ["url", "status", "score"],
    ["https://e.x/a", "NEW"],
    ["https://e.x/b", "NEW"],
    ["https://e.x/c", "NEW"],
]


def _book(emulator: SheetsEmulator) -> tuple[Any, str]:
    sid = emulator.create_spreadsheet("articles", sheets={"Queue": ROWS})
    return emulator.hook().get_conn(), sid


def _create(row: int, value: str, sheet_id: int = 0, **extra: Any) -> dict[str, Any]:
    location = {
        "dimensionRange": {"sheetId": sheet_id, "dimension": "ROWS", "startIndex": row, "endIndex": row + 1}
    }
    return {
        "createDeveloperMetadata": {
            "developerMetadata": {
                "metadataKey": KEY,
                "metadataValue": value,
                "location": location,
                "visibility": "DOCUMENT",
                **extra,
            }
        }
    }


def _batch(service: Any, sid: str, *requests: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = (
        service.spreadsheets().batchUpdate(spreadsheetId=sid, body={"requests": list(requests)}).execute()
    )
    return result


def _lookup(value: str) -> dict[str, Any]:
    return {"developerMetadataLookup": {"metadataKey": KEY, "metadataValue": value}}


def _read(service: Any, sid: str, *values: str) -> dict[str, Any]:
    body = {"dataFilters": [_lookup(v) for v in values], "valueRenderOption": "FORMULA"}
    result: dict[str, Any] = (
        service.spreadsheets().values().batchGetByDataFilter(spreadsheetId=sid, body=body).execute()
    )
    return result


def _write(service: Any, sid: str, value: str, cells: list[Any]) -> dict[str, Any]:
    body = {
        "valueInputOption": "RAW",
        "data": [{"dataFilter": _lookup(value), "majorDimension": "ROWS", "values": [cells]}],
        "includeValuesInResponse": True,
        "responseValueRenderOption": "FORMULA",
    }
    result: dict[str, Any] = (
        service.spreadsheets().values().batchUpdateByDataFilter(spreadsheetId=sid, body=body).execute()
    )
    return result


def _row_of(service: Any, sid: str, value: str) -> int | None:
    body = {"dataFilters": [_lookup(value)]}
    found = service.spreadsheets().developerMetadata().search(spreadsheetId=sid, body=body).execute()
    matched = found.get("matchedDeveloperMetadata", [])
    if not matched:
        return None
    assert len(matched) == 1
    return int(matched[0]["developerMetadata"]["location"]["dimensionRange"]["startIndex"])


def test_created_metadata_is_returned_with_an_id_and_can_be_fetched_and_searched(
    sheets_emulator: SheetsEmulator,
) -> None:
    service, sid = _book(sheets_emulator)
    reply = _batch(service, sid, _create(1, "t-a"), _create(2, "t-b", metadataId=77))
    created = [r["createDeveloperMetadata"]["developerMetadata"] for r in reply["replies"]]
    assert created[1]["metadataId"] == 77 and created[0]["metadataId"] > 0
    assert created[0]["location"] == {
        "locationType": "ROW",
        "dimensionRange": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 2},
    }
    got = service.spreadsheets().developerMetadata().get(spreadsheetId=sid, metadataId=77).execute()
    assert got["metadataValue"] == "t-b"
    by_key = (
        service.spreadsheets()
        .developerMetadata()
        .search(spreadsheetId=sid, body={"dataFilters": [{"developerMetadataLookup": {"metadataKey": KEY}}]})
        .execute()
    )
    assert sorted(m["developerMetadata"]["metadataValue"] for m in by_key["matchedDeveloperMetadata"]) == [
        "t-a",
        "t-b",
    ]
    by_range = (
        service.spreadsheets()
        .developerMetadata()
        .search(spreadsheetId=sid, body={"dataFilters": [{"a1Range": "Queue!A3:B3"}]})
        .execute()
    )
    assert [m["developerMetadata"]["metadataId"] for m in by_range["matchedDeveloperMetadata"]] == [77]
    with pytest.raises(HttpError) as err:
        service.spreadsheets().developerMetadata().get(spreadsheetId=sid, metadataId=78).execute()
    assert err.value.resp.status == 404
    with pytest.raises(HttpError) as err:  # ids are unique per spreadsheet
        _batch(service, sid, _create(3, "t-c", metadataId=77))
    assert err.value.resp.status == 400
    assert sheets_emulator.request_log["developerMetadata.search"] == 2
    assert sheets_emulator.request_log["developerMetadata.get"] == 2


def test_row_metadata_follows_its_row_through_insert_delete_and_sort(sheets_emulator: SheetsEmulator) -> None:
    service, sid = _book(sheets_emulator)
    _batch(service, sid, _create(1, "t-a"), _create(2, "t-b"), _create(3, "t-c"))
    insert = {
        "insertDimension": {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 3}}
    }
    _batch(service, sid, insert)
    assert [_row_of(service, sid, v) for v in ("t-a", "t-b", "t-c")] == [3, 4, 5]
    delete = {
        "deleteDimension": {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 4}}
    }
    _batch(service, sid, delete)  # the two blank rows and row a
    assert [_row_of(service, sid, v) for v in ("t-a", "t-b", "t-c")] == [None, 1, 2], "deleted with its row"
    sort = {
        "sortRange": {
            "range": {"sheetId": 0, "startRowIndex": 1},
            "sortSpecs": [{"dimensionIndex": 0, "sortOrder": "DESCENDING"}],
        }
    }
    _batch(service, sid, sort)
    assert sheets_emulator.values(sid, "Queue!A2:A3") == [["https://e.x/c"], ["https://e.x/b"]]
    assert [_row_of(service, sid, v) for v in ("t-b", "t-c")] == [2, 1], "sorted with its row"
    # values.append with INSERT_ROWS inserts rows above nothing of ours, so nothing moves
    assert _read(service, sid, "t-b")["valueRanges"][0]["valueRange"]["values"] == [["https://e.x/b", "NEW"]]


def test_writes_by_data_filter_reach_the_row_wherever_it_moved_and_skip_null_cells(
    sheets_emulator: SheetsEmulator,
) -> None:
    service, sid = _book(sheets_emulator)
    _batch(service, sid, _create(2, "t-b"))
    _batch(
        service,
        sid,
        {"insertDimension": {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 2}}},
    )
    reply = _write(service, sid, "t-b", [None, None, "0.9"])
    assert reply["totalUpdatedCells"] == 1
    assert reply["responses"][0]["updatedRange"] == "Queue!A4:C4"
    assert reply["responses"][0]["updatedData"]["values"] == [["https://e.x/b", "NEW", "0.9"]]
    assert sheets_emulator.values(sid, "Queue!A4:C4") == [["https://e.x/b", "NEW", "0.9"]]
    read = _read(service, sid, "t-b", "nothing-has-this")
    assert read["valueRanges"] == [
        {
            "valueRange": {
                "range": "Queue!A4:Z4",
                "majorDimension": "ROWS",
                "values": [["https://e.x/b", "NEW", "0.9"]],
            },
            "dataFilters": [_lookup("t-b")],
        }
    ]
    missing = _write(service, sid, "nothing-has-this", ["x"])
    assert "responses" not in missing and "totalUpdatedCells" not in missing, (
        "a filter matching nothing writes nothing"
    )
    assert sheets_emulator.values(sid, "Queue") == [ROWS[0], [], ROWS[1], [*ROWS[2], "0.9"], ROWS[3]]
    with pytest.raises(HttpError) as err:  # more values than the matched row holds: nothing written
        _write(service, sid, "t-b", ["x"] * 27)
    assert err.value.resp.status == 400
    assert sheets_emulator.request_log["values.batchUpdateByDataFilter"] == 3
    assert (
        sheets_emulator.request_log.writes >= 3
        and sheets_emulator.request_log["values.batchGetByDataFilter"] == 1
    )


def test_update_and_delete_by_filter_and_a_failing_batch_rolls_metadata_back(
    sheets_emulator: SheetsEmulator,
) -> None:
    service, sid = _book(sheets_emulator)
    _batch(service, sid, _create(1, "t-a"), _create(2, "t-b"))
    reply = _batch(
        service,
        sid,
        {
            "updateDeveloperMetadata": {
                "dataFilters": [_lookup("t-a")],
                "developerMetadata": {"metadataValue": "t-a2"},
                "fields": "metadataValue",
            }
        },
        {"deleteDeveloperMetadata": {"dataFilter": _lookup("t-b")}},
        {"deleteDeveloperMetadata": {"dataFilter": _lookup("t-b")}},
    )
    assert reply["replies"][0]["updateDeveloperMetadata"]["developerMetadata"][0]["metadataValue"] == "t-a2"
    assert (
        reply["replies"][1]["deleteDeveloperMetadata"]["deletedDeveloperMetadata"][0]["metadataValue"]
        == "t-b"
    )
    assert reply["replies"][2] == {"deleteDeveloperMetadata": {}}, "deleting what is gone is not an error"
    assert (_row_of(service, sid, "t-a2"), _row_of(service, sid, "t-b")) == (1, None)
    with pytest.raises(HttpError):
        _batch(
            service,
            sid,
            {"deleteDeveloperMetadata": {"dataFilter": _lookup("t-a2")}},
            _create(5000, "off-grid"),
        )
    assert _row_of(service, sid, "t-a2") == 1, "the whole batch was rolled back"


def test_metadata_survives_a_restart(sheets_emulator: SheetsEmulator) -> None:
    service, sid = _book(sheets_emulator)
    _batch(service, sid, _create(3, "t-c"))
    sheets_emulator.restart()
    service = sheets_emulator.hook().get_conn()
    _batch(
        service,
        sid,
        {"deleteDimension": {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 2}}},
    )
    assert _row_of(service, sid, "t-c") == 2


def test_writes_by_filter_race_inserts_and_deletes_without_landing_elsewhere(
    sheets_emulator: SheetsEmulator,
) -> None:
    """8 writer threads write each row's own label by metadata while an editor inserts and deletes."""
    rows = [["url", "status", "score"]] + [[f"https://e.x/{i}", "NEW"] for i in range(40)]
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"Queue": rows})
    service = sheets_emulator.hook().get_conn()
    _batch(service, sid, *(_create(i + 1, f"t-{i}") for i in range(40)))
    stop = threading.Event()
    errors: list[BaseException] = []

    def editor() -> None:
        svc = sheets_emulator.hook().get_conn()
        n = 0
        while not stop.is_set():
            at = 1 + n % 7
            req = {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": at, "endIndex": at + 1}}
            _batch(svc, sid, {"insertDimension": req})
            _batch(svc, sid, {"deleteDimension": req})
            n += 1

    def writer(k: int) -> None:
        try:
            svc = sheets_emulator.hook().get_conn()
            for i in range(k, 40, 8):
                _write(svc, sid, f"t-{i}", [None, None, f"score-{i}"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    edit = threading.Thread(target=editor)
    edit.start()
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    edit.join()
    assert not errors
    final = sheets_emulator.values(sid, "Queue")[1:]
    assert len(final) == 40
    assert all(row[2] == "score-" + row[0].rsplit("/", 1)[1] for row in final)


def test_grid_data_carries_each_rows_developer_metadata_and_it_moves_with_the_row(
    sheets_emulator: SheetsEmulator,
) -> None:
    """``spreadsheets.get`` grid data: ``rowMetadata`` holds one ``DimensionProperties`` per row of
    the range, whose ``developerMetadata`` is what is anchored to that row (Google's reference:
    "the developer metadata associated with a single row or column"); a ``fields`` mask keeps only
    what it names. The sheet queue's claim read takes its rows' anchors from there."""
    service, sid = _book(sheets_emulator)
    _batch(service, sid, _create(1, "t-a"), _create(3, "t-c"))
    mask = "sheets(data(rowMetadata(developerMetadata(metadataKey,metadataValue))))"

    def anchored() -> dict[int, list[str]]:
        reply = service.spreadsheets().get(spreadsheetId=sid, ranges=["Queue"], fields=mask).execute()
        (data,) = reply["sheets"][0]["data"]
        return {
            i: [m["metadataValue"] for m in props["developerMetadata"]]
            for i, props in enumerate(data["rowMetadata"])
            if props
        }

    assert anchored() == {1: ["t-a"], 3: ["t-c"]}
    insert = {
        "insertDimension": {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 2}}
    }
    _batch(service, sid, insert)
    assert anchored() == {2: ["t-a"], 4: ["t-c"]}
    part = service.spreadsheets().get(spreadsheetId=sid, ranges=["Queue!A3:C5"], fields=mask).execute()
    (data,) = part["sheets"][0]["data"]
    assert [p.get("developerMetadata", [{}])[0].get("metadataValue") for p in data["rowMetadata"]] == [
        "t-a",
        None,
        "t-c",
    ], "a range's rowMetadata starts at its first row"
