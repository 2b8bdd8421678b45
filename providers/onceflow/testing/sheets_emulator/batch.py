"""``spreadsheets.batchUpdate``: findReplace, row/column insert and delete, sortRange, addSheet,
deleteSheet, updateSheetProperties (in :mod:`~onceflow.testing.sheets_emulator.sheetprops`),
updateCells, appendCells and create/update/deleteDeveloperMetadata.

The whole batch is all-or-nothing, like Google's: on any error the spreadsheet is restored from a
snapshot taken before the first request.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from onceflow.testing.sheets_emulator.cells import Cell, Formula, formatted, parse_input
from onceflow.testing.sheets_emulator.errors import ApiError, invalid_argument
from onceflow.testing.sheets_emulator.metadata import (
    MetaFail,
    create_developer_metadata,
    delete_developer_metadata,
    update_developer_metadata,
)
from onceflow.testing.sheets_emulator.model import Sheet, Spreadsheet
from onceflow.testing.sheets_emulator.sheetprops import PropsFail, update_sheet_properties

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.testing.sheets_emulator.handlers import ApiRequest
    from onceflow.testing.sheets_emulator.model import Store


class _Fail(Exception):
    """A request-level error; the caller prefixes it with ``Invalid requests[i].kind:``."""


def _grid_bounds(book: Spreadsheet, grid: dict[str, Any]) -> tuple[Sheet, int, int, int, int]:
    sheet = book.sheet_by_id(int(grid.get("sheetId", 0)))
    r0 = int(grid.get("startRowIndex", 0))
    r1 = min(int(grid.get("endRowIndex", sheet.row_count)), sheet.row_count)
    c0 = int(grid.get("startColumnIndex", 0))
    c1 = min(int(grid.get("endColumnIndex", sheet.column_count)), sheet.column_count)
    if r0 < 0 or c0 < 0:
        raise _Fail("GridRange indexes must not be negative")
    return sheet, r0, r1, c0, c1


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    # proto3 JSON leaves out zero integers, so Google replies {"findReplace": {}} when nothing matched.
    return {k: v for k, v in counts.items() if v}


def find_replace(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    """Replace text in cells, counting what changed like Google's FindReplaceResponse.

    Value cells are matched on their formatted text; formula cells only with ``includeFormulas``
    (on their formula text, since the emulator never evaluates them). A replacement never turns a
    value cell into a formula.
    """
    find = spec.get("find", "")
    if find == "":
        raise _Fail("find must not be empty")
    replacement = spec.get("replacement", "")
    scopes = [k for k in ("range", "sheetId") if spec.get(k) is not None]
    if spec.get("allSheets"):
        scopes.append("allSheets")
    if len(scopes) != 1:
        raise _Fail("Exactly one of range, sheetId or allSheets must be set")
    flags = 0 if spec.get("matchCase") else re.IGNORECASE
    if spec.get("searchByRegex"):
        try:
            pattern = re.compile(find, flags)
        except re.error as exc:
            raise _Fail(f"Invalid regular expression {find!r}: {exc}") from None
        # Google's replacement syntax refers to groups as $1; Python's as \g<1>.
        template = re.sub(r"\$(\d+)", r"\\g<\1>", replacement.replace("\\", "\\\\"))

        def substitute(m: re.Match[str]) -> str:
            return m.expand(template)
    else:
        pattern = re.compile(re.escape(find), flags)

        def substitute(m: re.Match[str]) -> str:
            return replacement

    include_formulas = bool(spec.get("includeFormulas"))
    whole = bool(spec.get("matchEntireCell"))
    if "range" in scopes:
        targets = [_grid_bounds(book, spec["range"])]
    elif "sheetId" in scopes:
        sheet = book.sheet_by_id(int(spec["sheetId"]))
        targets = [(sheet, 0, sheet.row_count, 0, sheet.column_count)]
    else:
        targets = [(s, 0, s.row_count, 0, s.column_count) for s in book.sheets]

    # the claim protocol's whole-column findReplace on 50,000 rows: skip non-matching text cheaply
    plain = whole and not spec.get("searchByRegex") and bool(spec.get("matchCase"))
    occurrences = values = formulas = 0
    rows: set[tuple[int, int]] = set()
    sheets: set[int] = set()
    for sheet, r0, r1, c0, c1 in targets:
        for r in range(r0, min(r1, len(sheet.rows))):
            cells = sheet.rows[r]
            for c in range(c0, min(c1, len(cells))):
                cell = cells[c]
                if cell is None or (plain and type(cell) is str and cell != find):
                    continue
                is_formula = isinstance(cell, Formula)
                if is_formula and not include_formulas:
                    continue
                text = str(cell) if is_formula else formatted(cell)
                if whole:
                    m = pattern.fullmatch(text)
                    if m is None:
                        continue
                    new_text, count = substitute(m), 1
                else:
                    new_text, count = pattern.subn(substitute, text)
                    if count == 0:
                        continue
                new: Cell
                if is_formula:
                    new = Formula(new_text) if new_text.startswith("=") else new_text or None
                    formulas += 1
                elif isinstance(cell, str):
                    new = new_text or None
                    values += 1
                else:
                    parsed = parse_input(new_text, "RAW" if new_text.startswith("=") else "USER_ENTERED")
                    new = parsed if not isinstance(parsed, type) else None
                    values += 1
                cells[c] = new
                occurrences += count
                rows.add((sheet.sheet_id, r))
                sheets.add(sheet.sheet_id)
    return {
        "findReplace": _nonzero(
            {
                "valuesChanged": values,
                "formulasChanged": formulas,
                "rowsChanged": len(rows),
                "sheetsChanged": len(sheets),
                "occurrencesChanged": occurrences,
            }
        )
    }


def _dimension_range(book: Spreadsheet, spec: dict[str, Any]) -> tuple[Sheet, str, int, int]:
    rng = spec.get("range") or {}
    sheet = book.sheet_by_id(int(rng.get("sheetId", 0)))
    dimension = rng.get("dimension", "")
    if dimension not in ("ROWS", "COLUMNS"):
        raise _Fail("range.dimension must be ROWS or COLUMNS")
    size = sheet.row_count if dimension == "ROWS" else sheet.column_count
    start = int(rng.get("startIndex", 0))
    end = int(rng.get("endIndex", size))
    if start < 0 or end <= start:
        raise _Fail(f"Invalid dimension range: startIndex {start}, endIndex {end}")
    return sheet, dimension, start, end


def insert_dimension(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    sheet, dimension, start, end = _dimension_range(book, spec)
    size = sheet.row_count if dimension == "ROWS" else sheet.column_count
    if start > size:
        raise _Fail(f"Cannot insert at index {start}: the sheet has only {size} {dimension.lower()}")
    if dimension == "ROWS":
        sheet.insert_rows(start, end - start)
    else:
        sheet.insert_columns(start, end - start)
    return {}


def delete_dimension(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    sheet, dimension, start, end = _dimension_range(book, spec)
    size = sheet.row_count if dimension == "ROWS" else sheet.column_count
    end = min(end, size)
    if start >= size:
        raise _Fail(f"Cannot delete from index {start}: the sheet has only {size} {dimension.lower()}")
    if start == 0 and end == size:
        raise _Fail(f"You can't delete all the {dimension.lower()} on the sheet.")
    if dimension == "ROWS":
        sheet.delete_rows(start, end)
    else:
        sheet.delete_columns(start, end)
    return {}


def add_sheet(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    props = spec.get("properties") or {}
    title = props.get("title")
    if not title:
        n = len(book.sheets) + 1
        while book.sheet_by_title(f"Sheet{n}") is not None:
            n += 1
        title = f"Sheet{n}"
    try:
        sheet = book.add_sheet(title, props.get("sheetId"), props.get("index"))
    except ApiError as exc:
        raise _Fail(exc.message.split(": ", 1)[-1]) from None
    grid = props.get("gridProperties") or {}
    sheet.row_count = int(grid.get("rowCount", sheet.row_count))
    sheet.column_count = int(grid.get("columnCount", sheet.column_count))
    return {"addSheet": {"properties": sheet.properties(book.sheets.index(sheet))}}


def delete_sheet(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    sheet = book.sheet_by_id(int(spec.get("sheetId", 0)))
    if len(book.sheets) == 1:
        raise _Fail("You can't remove all the sheets in a document.")
    book.sheets.remove(sheet)
    return {}


def _extended(value: dict[str, Any] | None) -> Cell:
    """Decode a CellData.userEnteredValue (ExtendedValue)."""
    if not value:
        return None
    if "formulaValue" in value:
        return Formula(value["formulaValue"])
    if "stringValue" in value:
        return value["stringValue"] or None
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "numberValue" in value:
        parsed = parse_input(float(value["numberValue"]), "RAW")
        return parsed if not isinstance(parsed, type) else None
    raise _Fail(f"Unsupported ExtendedValue {sorted(value)}")


def _row_cells(rows: list[dict[str, Any]]) -> list[list[Cell]]:
    return [[_extended(cell.get("userEnteredValue")) for cell in row.get("values") or []] for row in rows]


def _check_fields(spec: dict[str, Any]) -> None:
    fields = spec.get("fields", "")
    if not fields:
        raise _Fail("At least one field must be updated, but none were specified in 'fields'.")
    if fields not in ("*", "userEnteredValue") and "userEnteredValue" not in fields.split(","):
        raise _Fail(f"The emulator only updates userEnteredValue, not {fields!r}")


def update_cells(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    _check_fields(spec)
    data = _row_cells(spec.get("rows") or [])
    if "start" in spec:
        start = spec["start"]
        sheet = book.sheet_by_id(int(start.get("sheetId", 0)))
        r0, c0 = int(start.get("rowIndex", 0)), int(start.get("columnIndex", 0))
        for r, row in enumerate(data):
            for c, value in enumerate(row):
                sheet.set(r0 + r, c0 + c, value)
        return {}
    if "range" not in spec:
        raise _Fail("Exactly one of start or range must be set")
    sheet, r0, r1, c0, c1 = _grid_bounds(book, spec["range"])
    # With a range, the field mask covers every cell of it: cells the rows leave out are cleared.
    for r in range(r0, r1):
        row = data[r - r0] if r - r0 < len(data) else []
        for c in range(c0, c1):
            sheet.set(r, c, row[c - c0] if c - c0 < len(row) else None)
    return {}


def append_cells(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    _check_fields(spec)
    sheet = book.sheet_by_id(int(spec.get("sheetId", 0)))
    last = len(sheet.rows)
    while last and not any(c is not None for c in sheet.rows[last - 1]):
        last -= 1
    for r, row in enumerate(_row_cells(spec.get("rows") or [])):
        for c, value in enumerate(row):
            sheet.set(last + r, c, value)
    return {}


def _sort_key(cell: Cell) -> tuple[int, Any]:
    # Google's order: numbers, then text (case-insensitive), then booleans; empty cells always last
    if isinstance(cell, bool):
        return (2, cell)
    if isinstance(cell, (int, float)):
        return (0, cell)
    if isinstance(cell, Formula):
        return (1, str(cell).casefold())
    return (1, str(cell).casefold())


def sort_range(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    """Sort the rows of a range by ``sortSpecs`` (``dimensionIndex``, ``sortOrder``); stable.

    Only a range spanning every column moves whole rows; then row-anchored metadata moves with
    its row. A narrower range moves just those cells, and row metadata stays where it is.
    """
    sheet, r0, r1, c0, c1 = _grid_bounds(book, spec.get("range") or {})
    specs = spec.get("sortSpecs") or []
    if not specs:
        raise _Fail("At least one sortSpec is required")
    order = list(range(r0, r1))
    for sort_spec in reversed(specs):  # stable sorts, least significant key first
        col = int(sort_spec.get("dimensionIndex", 0))
        if not c0 <= col < c1:
            raise _Fail(f"dimensionIndex {col} is outside the sorted range")
        descending = sort_spec.get("sortOrder", "ASCENDING") == "DESCENDING"
        filled = [r for r in order if sheet.get(r, col) is not None]
        empty = [r for r in order if sheet.get(r, col) is None]
        filled.sort(key=lambda r: _sort_key(sheet.get(r, col)), reverse=descending)
        order = filled + empty
    if c0 == 0 and c1 >= sheet.column_count:
        sheet.permute_rows(r0, order)
        return {}
    block = [[sheet.get(r, c) for c in range(c0, c1)] for r in order]
    for i, cells in enumerate(block):
        for j, value in enumerate(cells):
            sheet.set(r0 + i, c0 + j, value)
    return {}


def _meta(
    fn: Callable[[Spreadsheet, dict[str, Any]], dict[str, Any]],
) -> Callable[[Spreadsheet, dict[str, Any]], dict[str, Any]]:
    def run(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            return fn(book, spec)
        except (MetaFail, PropsFail) as exc:
            raise _Fail(str(exc)) from None

    return run


REQUESTS: dict[str, Callable[[Spreadsheet, dict[str, Any]], dict[str, Any]]] = {
    "findReplace": find_replace,
    "insertDimension": insert_dimension,
    "deleteDimension": delete_dimension,
    "sortRange": sort_range,
    "addSheet": add_sheet,
    "deleteSheet": delete_sheet,
    "updateSheetProperties": _meta(update_sheet_properties),
    "updateCells": update_cells,
    "appendCells": append_cells,
    "createDeveloperMetadata": _meta(create_developer_metadata),
    "updateDeveloperMetadata": _meta(update_developer_metadata),
    "deleteDeveloperMetadata": _meta(delete_developer_metadata),
}


def _snapshot(book: Spreadsheet) -> tuple[list[Sheet], list[Any]]:
    sheets = [
        dataclasses.replace(
            s, rows=[list(row) for row in s.rows], metadata=[dataclasses.replace(m) for m in s.metadata]
        )
        for s in book.sheets
    ]
    return sheets, [dataclasses.replace(m) for m in book.metadata]


def spreadsheets_batch_update(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    requests = req.body.get("requests") or []
    if not requests:
        raise invalid_argument("Must specify at least one request.")
    # a single request validates before it changes anything; copying a 50,000-row sheet is not free
    snapshot = _snapshot(book) if len(requests) > 1 else None
    replies = []
    try:
        for i, item in enumerate(requests):
            kinds = [k for k in item if k in REQUESTS]
            unknown = [k for k in item if k not in REQUESTS]
            if unknown:
                raise invalid_argument(
                    f"Invalid requests[{i}]: {unknown[0]} is not supported by the onceflow Sheets emulator"
                )
            if len(kinds) != 1:
                raise invalid_argument(f"Invalid requests[{i}]: exactly one kind of request must be set")
            kind = kinds[0]
            try:
                replies.append(REQUESTS[kind](book, item[kind] or {}))
            except _Fail as exc:
                raise invalid_argument(f"Invalid requests[{i}].{kind}: {exc}") from None
            except ApiError as exc:
                raise invalid_argument(exc.message.replace("requests[0]", f"requests[{i}]")) from None
    except ApiError:
        if snapshot is not None:
            book.sheets, book.metadata = snapshot
        raise
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id, "replies": replies}
    if req.body.get("includeSpreadsheetInResponse"):
        out["updatedSpreadsheet"] = book.resource()
    return out
