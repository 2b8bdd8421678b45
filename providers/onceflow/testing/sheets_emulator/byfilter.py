"""``values.batchGetByDataFilter`` and ``values.batchUpdateByDataFilter``.

A DataFilter with a ``developerMetadataLookup`` selects the whole row (column, sheet) each matching
metadata entry is anchored to at the moment the request is applied, so a write keyed by row
metadata reaches that row wherever inserts, deletes and sorts have moved it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.testing.sheets_emulator.a1 import column_letters
from onceflow.testing.sheets_emulator.cells import Cell, Skip, parse_input
from onceflow.testing.sheets_emulator.errors import invalid_argument
from onceflow.testing.sheets_emulator.handlers import (
    Write,
    _dimension,
    _input_option,
    _render_option,
    _transpose,
    batch_totals,
    value_range,
)
from onceflow.testing.sheets_emulator.metadata import filter_ranges

if TYPE_CHECKING:
    from onceflow.testing.sheets_emulator.handlers import ApiRequest
    from onceflow.testing.sheets_emulator.model import Bounds, Store


def values_batch_get_by_data_filter(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    dimension = _dimension(req.body.get("majorDimension", ""))
    option = _render_option(req.body.get("valueRenderOption", ""))
    matched: dict[str, tuple[Bounds, list[dict[str, Any]]]] = {}
    for data_filter in req.body.get("dataFilters") or []:
        for bounds in filter_ranges(book, data_filter):
            # one MatchedValueRange per distinct range, listing every filter that selected it
            matched.setdefault(bounds.a1(), (bounds, []))[1].append(data_filter)
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id}
    if matched:
        out["valueRanges"] = [
            {"valueRange": value_range(bounds, dimension, option), "dataFilters": filters}
            for bounds, filters in matched.values()
        ]
    return out


def _plan(bounds: Bounds, item: dict[str, Any], option: str) -> Write:
    """A write bounded by the matched range: fewer values write only those cells (the rest are
    left alone), more values than the range holds fail the whole request, as Google documents."""
    values = item.get("values") or []
    if not isinstance(values, list) or not all(isinstance(r, list) for r in values):
        raise invalid_argument("Invalid values: expected a list of lists")
    if _dimension(item.get("majorDimension", "")) == "COLUMNS":
        values = _transpose(values)
    rows, cols = bounds.end_row - bounds.start_row, bounds.end_col - bounds.start_col
    if len(values) > rows or any(len(r) > cols for r in values):
        width = max((len(r) for r in values), default=0)
        raise invalid_argument(
            f"Requested writing within range [{bounds.a1()}], but tried writing to "
            + (
                f"row [{bounds.start_row + len(values)}]"
                if len(values) > rows
                else f"column [{column_letters(bounds.start_col + width - 1)}]"
            )
        )
    cells: list[tuple[int, int, Cell]] = []
    width = 0
    for r, row in enumerate(values):
        width = max(width, len(row))
        for c, raw in enumerate(row):
            parsed = parse_input(raw, option)
            if parsed is Skip:  # null: leave the cell alone
                continue
            cells.append((bounds.start_row + r, bounds.start_col + c, parsed))  # type: ignore[arg-type]
    return Write(bounds.sheet, bounds.start_row, bounds.start_col, cells, len(values), width)


def values_batch_update_by_data_filter(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    option = _input_option(req.body.get("valueInputOption", ""))
    include = bool(req.body.get("includeValuesInResponse"))
    render_option = _render_option(req.body.get("responseValueRenderOption", ""))
    planned: list[tuple[Write, Bounds, dict[str, Any]]] = []
    for item in req.body.get("data") or []:
        data_filter = item.get("dataFilter") or {}
        for bounds in filter_ranges(book, data_filter):
            planned.append((_plan(bounds, item, option), bounds, data_filter))
    for write, _, _ in planned:  # every write validated before any is applied
        write.apply()
    responses = []
    for write, bounds, data_filter in planned:
        reply: dict[str, Any] = {
            k: v for k, v in write.summary(book.spreadsheet_id).items() if k != "spreadsheetId"
        }
        reply["dataFilter"] = data_filter
        if include:
            reply["updatedData"] = value_range(bounds, "ROWS", render_option)
        responses.append(reply)
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id}
    out.update(batch_totals([w for w, _, _ in planned]))
    if responses:
        out["responses"] = responses
    return out
