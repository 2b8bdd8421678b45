"""The emulator as Google: spreadsheets.create's sheets, the developer metadata cap, a dropped reply.

Every call goes through the real google-api-python-client (and its httplib2 transport) over HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from googleapiclient.errors import HttpError

from onceflow.sheets.anchors import create as anchor
from onceflow.sheets.transport import anonymous_service

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator


def _create(service: Any, body: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = service.spreadsheets().create(body=body).execute(num_retries=0)
    return reply


def _tabs(reply: dict[str, Any]) -> list[tuple[str, int]]:
    return [(s["properties"]["title"], s["properties"]["sheetId"]) for s in reply["sheets"]]


def test_create_without_sheets_makes_one_sheet1_with_id_0(sheets_emulator: SheetsEmulator) -> None:
    service = anonymous_service(sheets_emulator.endpoint)
    made = _create(service, {"properties": {"title": "queue"}})
    assert _tabs(made) == [("Sheet1", 0)]
    again = service.spreadsheets().get(spreadsheetId=made["spreadsheetId"]).execute()
    assert _tabs(again) == [("Sheet1", 0)] and again["properties"]["title"] == "queue"


def test_create_with_sheets_makes_exactly_those_sheets(sheets_emulator: SheetsEmulator) -> None:
    service = anonymous_service(sheets_emulator.endpoint)
    made = _create(
        service,
        {
            "properties": {"title": "articles"},
            "sheets": [
                {"properties": {"title": "Sheet1"}},  # failed before: a Sheet1 was made first
                {"properties": {"title": "queue", "sheetId": 7, "gridProperties": {"rowCount": 50}}},
                {"properties": {"title": "audit"}},
            ],
        },
    )
    assert _tabs(made) == [("Sheet1", 0), ("queue", 7), ("audit", 1)]
    assert made["sheets"][1]["properties"]["gridProperties"]["rowCount"] == 50
    fetched = service.spreadsheets().get(spreadsheetId=made["spreadsheetId"]).execute()
    assert _tabs(fetched) == _tabs(made)


def test_create_with_one_title_twice_is_a_400_and_makes_nothing(sheets_emulator: SheetsEmulator) -> None:
    service = anonymous_service(sheets_emulator.endpoint)
    before = set(sheets_emulator.server.store.spreadsheets)
    body = {"sheets": [{"properties": {"title": "queue"}}, {"properties": {"title": "Queue"}}]}
    with pytest.raises(HttpError) as caught:
        _create(service, body)
    assert caught.value.resp.status == 400 and "already exists" in str(caught.value)
    assert set(sheets_emulator.server.store.spreadsheets) == before


def _anchor_batch(sheet_id: int, rows: range, value_length: int = 27) -> list[dict[str, Any]]:
    return [anchor(sheet_id, n, f"{n:0{value_length}d}") for n in rows]


def _metadata(service: Any, sid: str) -> list[dict[str, Any]]:
    found = (
        service.spreadsheets()
        .developerMetadata()
        .search(
            spreadsheetId=sid,
            body={"dataFilters": [{"developerMetadataLookup": {"metadataKey": "onceflow.claim"}}]},
        )
        .execute()
    )
    return [m["developerMetadata"] for m in found.get("matchedDeveloperMetadata", [])]


def test_developer_metadata_past_30000_characters_is_googles_400(sheets_emulator: SheetsEmulator) -> None:
    service = anonymous_service(sheets_emulator.endpoint)
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [["url"]] * 900})
    batch = service.spreadsheets().batchUpdate
    # each anchor is "onceflow.claim" (14) + a 27-character value = 41 characters: 731 fit
    batch(spreadsheetId=sid, body={"requests": _anchor_batch(0, range(1, 732))}).execute()
    assert len(_metadata(service, sid)) == 731
    with pytest.raises(HttpError) as caught:
        batch(
            spreadsheetId=sid,
            body={
                "requests": [
                    {"findReplace": {"find": "url", "replacement": "URL", "sheetId": 0}},
                    *_anchor_batch(0, range(732, 734)),
                ]
            },
        ).execute(num_retries=0)
    assert caught.value.resp.status == 400
    reason = caught.value.reason
    assert reason.startswith("Invalid requests[1].createDeveloperMetadata: Developer metadata size limit")
    assert "30012 characters" in reason and "30000 allowed" in reason
    # all or nothing: neither the findReplace nor the first anchor of the refused batch landed
    assert sheets_emulator.values(sid, "queue!A1") == [["url"]]
    assert len(_metadata(service, sid)) == 731
    # deleting one makes room for one, in the same batch
    doomed = {
        "deleteDeveloperMetadata": {"dataFilter": {"developerMetadataLookup": {"metadataValue": f"{1:027d}"}}}
    }
    batch(spreadsheetId=sid, body={"requests": [doomed, *_anchor_batch(0, range(800, 801))]}).execute()
    assert len(_metadata(service, sid)) == 731


def test_the_cap_counts_per_sheet_and_per_spreadsheet_and_is_configurable(
    sheets_emulator: SheetsEmulator,
) -> None:
    service = anonymous_service(sheets_emulator.endpoint)
    sid = sheets_emulator.create_spreadsheet("q", sheets={"a": [["x"]] * 30, "b": [["x"]] * 30})
    sheets_emulator.set_metadata_limit(41 * 30)
    batch = service.spreadsheets().batchUpdate
    batch(spreadsheetId=sid, body={"requests": _anchor_batch(0, range(1, 21))}).execute()
    with pytest.raises(HttpError, match="sheet with id 0"):  # 21 + 10 > 30 on sheet a
        batch(
            spreadsheetId=sid,
            body={"requests": _anchor_batch(0, range(21, 31)) + _anchor_batch(0, range(1, 2))},
        ).execute(num_retries=0)
    batch(spreadsheetId=sid, body={"requests": _anchor_batch(1, range(1, 11))}).execute()
    with pytest.raises(HttpError, match="the spreadsheet would hold"):  # 20 on a + 11 on b > 30
        batch(spreadsheetId=sid, body={"requests": _anchor_batch(1, range(11, 12))}).execute(num_retries=0)
    sheets_emulator.set_metadata_limit(None)
    batch(spreadsheetId=sid, body={"requests": _anchor_batch(1, range(11, 30))}).execute()
    assert len(_metadata(service, sid)) == 49


def test_apply_then_drop_lands_the_write_and_httplib2_sends_it_again(sheets_emulator: SheetsEmulator) -> None:
    service = anonymous_service(sheets_emulator.endpoint)
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [["status"], ["NEW"]]})
    claim = {
        "findReplace": {
            "find": "NEW",
            "replacement": "PROCESSING #t",
            "range": {
                "sheetId": 0,
                "startRowIndex": 1,
                "endRowIndex": 2,
                "startColumnIndex": 0,
                "endColumnIndex": 1,
            },
            "matchEntireCell": True,
            "matchCase": True,
        }
    }
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
    reply = (
        service.spreadsheets()
        .batchUpdate(spreadsheetId=sid, body={"requests": [claim]})
        .execute(num_retries=0)
    )
    # the first copy was applied and its reply dropped; httplib2 sent the body again, unasked
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] == 2
    assert sheets_emulator.request_log.snapshot()["faults"] == {"apply_then_drop": 1}
    assert reply["replies"] == [{"findReplace": {}}], "the resent claim finds its own token and says 0"
    assert sheets_emulator.values(sid, "queue!A2") == [["PROCESSING #t"]]
