"""What a human editor does to a sheet, as ``spreadsheets.batchUpdate`` requests.

Tests of the queue's position independence play an editor who inserts, deletes and sorts rows
under the claimers; these builders keep the request dicts (0-based, end-exclusive indexes, as in
the Sheets API) in one place. Send them through a second client, as a real editor would::

    editor = anonymous_service(sheets_emulator.endpoint)
    batch_update(editor, sid, insert_rows(sheet_id, 1), set_row(sheet_id, 1, ["https://x.example/", "NEW"]))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence


def _rows(sheet_id: int, start: int, end: int) -> dict[str, Any]:
    return {"range": {"sheetId": sheet_id, "dimension": "ROWS", "startIndex": start, "endIndex": end}}


def insert_rows(sheet_id: int, at: int, count: int = 1) -> dict[str, Any]:
    """Insert ``count`` empty rows before row index ``at`` (0 is the header row)."""
    return {"insertDimension": _rows(sheet_id, at, at + count)}


def delete_rows(sheet_id: int, start: int, end: int) -> dict[str, Any]:
    """Delete row indexes ``start`` up to, not including, ``end``."""
    return {"deleteDimension": _rows(sheet_id, start, end)}


def set_row(sheet_id: int, row_index: int, cells: Sequence[str]) -> dict[str, Any]:
    """Type ``cells`` as strings into row index ``row_index`` from column A (no formula parsing)."""
    return {
        "updateCells": {
            "start": {"sheetId": sheet_id, "rowIndex": row_index, "columnIndex": 0},
            "rows": [{"values": [{"userEnteredValue": {"stringValue": v}} for v in cells]}],
            "fields": "userEnteredValue",
        }
    }


def sort_rows(sheet_id: int, column: int = 0, *, descending: bool = False) -> dict[str, Any]:
    """Sort every row below the header by ``column`` (0 is A)."""
    return {
        "sortRange": {
            "range": {"sheetId": sheet_id, "startRowIndex": 1},
            "sortSpecs": [
                {"dimensionIndex": column, "sortOrder": "DESCENDING" if descending else "ASCENDING"}
            ],
        }
    }


def batch_update(service: Any, spreadsheet_id: str, *requests: dict[str, Any]) -> dict[str, Any]:
    """Send ``requests`` in one ``spreadsheets.batchUpdate`` (applied together or not at all).

    :param service: a ``sheets`` v4 service, e.g. ``anonymous_service(emulator.endpoint)``.
    :return: the API's reply.
    """
    reply: dict[str, Any] = (
        service.spreadsheets()
        .batchUpdate(spreadsheetId=spreadsheet_id, body={"requests": list(requests)})
        .execute()
    )
    return reply


__all__ = ["batch_update", "delete_rows", "insert_rows", "set_row", "sort_rows"]
