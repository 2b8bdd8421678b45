"""The API methods: ``spreadsheets.get``/``create`` and ``spreadsheets.values.*``.

Each handler takes the :class:`~onceflow.testing.sheets_emulator.model.Store` (its lock already held
by the caller) and an :class:`ApiRequest`, and returns the JSON reply. Writes are planned first and
applied only when the whole request is valid, so a rejected request changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onceflow.testing.sheets_emulator.a1 import A1Error, column_letters, parse_a1
from onceflow.testing.sheets_emulator.cells import (
    INPUT_OPTIONS,
    RENDER_OPTIONS,
    Cell,
    Skip,
    parse_input,
    render,
)
from onceflow.testing.sheets_emulator.errors import invalid_argument
from onceflow.testing.sheets_emulator.model import Bounds, Sheet, Spreadsheet, Store, grid_error
from onceflow.testing.sheets_emulator.tables import find_table


@dataclass
class ApiRequest:
    """One decoded API call.

    :param method: method name, e.g. ``values.update`` (the keys of ``server.METHODS``).
    :param spreadsheet_id: the spreadsheet in the path, if any.
    :param range: the percent-decoded A1 range in the path, if any.
    :param params: query parameters (every value a list, as ``parse_qs`` gives them).
    :param body: the JSON body (``{}`` when none).
    """

    method: str
    spreadsheet_id: str = ""
    range: str = ""
    params: dict[str, list[str]] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)

    def param(self, name: str, default: str = "") -> str:
        values = self.params.get(name)
        return values[-1] if values else default

    def flag(self, name: str) -> bool:
        return self.param(name, "false").lower() == "true"


@dataclass
class Write:
    """A validated write: cells to set, and what Google reports about it."""

    sheet: Sheet
    start_row: int
    start_col: int
    cells: list[tuple[int, int, Cell]]
    rows: int
    cols: int

    def apply(self) -> None:
        for row, col, value in self.cells:
            self.sheet.set(row, col, value)

    def bounds(self) -> Bounds:
        # An empty write still reports the cell it was anchored at.
        rows, cols = max(self.rows, 1), max(self.cols, 1)
        return Bounds(
            self.sheet, self.start_row, self.start_row + rows, self.start_col, self.start_col + cols
        )

    def summary(self, spreadsheet_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {"spreadsheetId": spreadsheet_id, "updatedRange": self.bounds().a1()}
        if self.cells:
            out["updatedRows"] = len({r for r, _, _ in self.cells})
            out["updatedColumns"] = len({c for _, c, _ in self.cells})
            out["updatedCells"] = len(self.cells)
        return out


def batch_totals(writes: list[Write]) -> dict[str, int]:
    """A batch's ``totalUpdated*``: the rows, columns, cells and sheets at least one of its writes
    changed, each counted once however many ranges touched it (zeros left out, as proto3 JSON)."""
    cells = {(w.sheet.sheet_id, r, c) for w in writes for r, c, _ in w.cells}
    totals = {
        "totalUpdatedRows": len({(s, r) for s, r, _ in cells}),
        "totalUpdatedColumns": len({(s, c) for s, _, c in cells}),
        "totalUpdatedCells": len(cells),
        "totalUpdatedSheets": len({s for s, _, _ in cells}),
    }
    return {k: v for k, v in totals.items() if v}


def _dimension(value: str | None) -> str:
    # absent, null and DIMENSION_UNSPECIFIED all mean ROWS, in a body as in a query
    if value in (None, "", "DIMENSION_UNSPECIFIED", "ROWS"):
        return "ROWS"
    if value == "COLUMNS":
        return "COLUMNS"
    raise invalid_argument(f"Invalid value at 'major_dimension' ({value})")


def _render_option(value: str) -> str:
    if value == "":
        return "FORMATTED_VALUE"
    if value not in RENDER_OPTIONS:
        raise invalid_argument(f"Invalid value at 'value_render_option' ({value})")
    return value


def _input_option(value: str) -> str:
    if value in ("", "INPUT_VALUE_OPTION_UNSPECIFIED"):
        raise invalid_argument("'valueInputOption' is required but not specified")
    if value not in INPUT_OPTIONS:
        raise invalid_argument(f"Invalid value at 'value_input_option' ({value})")
    return value


def _transpose(rows: list[list[Any]]) -> list[list[Any]]:
    width = max((len(r) for r in rows), default=0)
    return [[r[c] if c < len(r) else None for r in rows] for c in range(width)]


def _trim(cells: list[Any]) -> list[Any]:
    end = len(cells)
    while end and cells[end - 1] is None:
        end -= 1
    return cells[:end]


def value_range(bounds: Bounds, dimension: str, option: str) -> dict[str, Any]:
    """Read ``bounds`` as a ValueRange: trailing empty rows and columns trimmed, ``values`` omitted
    when there is nothing, like Google."""
    block = bounds.sheet.block(bounds)
    if dimension == "COLUMNS":
        block = [_trim(col) for col in _transpose(block)]
        while block and not block[-1]:
            block.pop()
    out: dict[str, Any] = {"range": bounds.a1(), "majorDimension": dimension}
    if block:
        out["values"] = [[render(c, option) for c in row] for row in block]
    return out


def plan_write(
    book: Spreadsheet, range_text: str, body: dict[str, Any], option: str, *, anchor: Bounds | None = None
) -> Write:
    """Validate one ValueRange write and return what it would change.

    A single-cell range is an anchor the data grows from; a larger range bounds the data and
    writing past it is an error, as in Google. values.update cannot write past the sheet's grid
    (Google answers "exceeds grid limits"); values.append, given an ``anchor``, grows the grid.

    :param book: the spreadsheet.
    :param range_text: the A1 range of the request.
    :param body: the ValueRange (``values``, ``majorDimension``).
    :param option: RAW or USER_ENTERED.
    :param anchor: where to write instead of the range's start (values.append).
    """
    try:
        rng = parse_a1(range_text)
    except A1Error:
        raise invalid_argument(f"Unable to parse range: {range_text}") from None
    bounds = anchor or book.bounds(rng, range_text)
    values = body.get("values") or []
    if not isinstance(values, list) or not all(isinstance(r, list) for r in values):
        raise invalid_argument("Invalid values: expected a list of lists")
    if _dimension(body.get("majorDimension", "")) == "COLUMNS":
        values = _transpose(values)
    single_cell = rng.end_row == rng.start_row + 1 and rng.end_col == rng.start_col + 1
    limit_rows = None if anchor or single_cell or rng.end_row is None else rng.end_row - rng.start_row
    limit_cols = None if anchor or single_cell or rng.end_col is None else rng.end_col - rng.start_col
    if limit_rows is not None and len(values) > limit_rows:
        raise invalid_argument(
            f"Requested writing within range [{range_text}], but tried writing to row "
            f"[{bounds.start_row + len(values)}]"
        )
    cells: list[tuple[int, int, Cell]] = []
    width = 0
    for r, row in enumerate(values):
        if limit_cols is not None and len(row) > limit_cols:
            raise invalid_argument(
                f"Requested writing within range [{range_text}], but tried writing to column "
                f"[{column_letters(bounds.start_col + len(row) - 1)}]"
            )
        width = max(width, len(row))
        for c, raw in enumerate(row):
            parsed = parse_input(raw, option)
            if parsed is Skip:
                continue
            cells.append((bounds.start_row + r, bounds.start_col + c, parsed))  # type: ignore[arg-type]
    sheet = bounds.sheet
    end_row, end_col = bounds.start_row + len(values), bounds.start_col + width
    if anchor is None and (end_row > sheet.row_count or end_col > sheet.column_count):
        raise grid_error(sheet, bounds.start_row, end_row, bounds.start_col, end_col)
    return Write(bounds.sheet, bounds.start_row, bounds.start_col, cells, len(values), width)


def _updated_data(write: Write, req: ApiRequest) -> dict[str, Any]:
    option = _render_option(req.param("responseValueRenderOption"))
    return value_range(write.bounds(), "ROWS", option)


# -- spreadsheets ---------------------------------------------------------------------------------


def spreadsheets_get(store: Store, req: ApiRequest) -> dict[str, Any]:
    """The Spreadsheet, limited to the sheets ``ranges`` touch, with their grid data when asked
    (``includeGridData``, or a ``fields`` mask that lists it), then cut to ``fields``
    (:mod:`~onceflow.testing.sheets_emulator.grid`)."""
    from onceflow.testing.sheets_emulator import grid

    book = store.get(req.spreadsheet_id)
    mask = grid.parse_mask(req.param("fields")) if req.param("fields") else None
    resource = book.resource()
    ranges = req.params.get("ranges") or []
    if ranges:
        # Only the sheets the ranges touch are returned, as Google does.
        wanted = {book.resolve(r).sheet.sheet_id for r in ranges}
        resource["sheets"] = [s for s in resource["sheets"] if s["properties"]["sheetId"] in wanted]
    if grid.wants_grid_data(mask, req.flag("includeGridData")):
        grid.with_grid_data(book, resource, ranges)
    out: dict[str, Any] = grid.apply_mask(resource, mask)
    return out


def spreadsheets_create(store: Store, req: ApiRequest) -> dict[str, Any]:
    """Exactly the ``sheets`` asked for (ids counting from 0 where none is given); without
    ``sheets``, one ``Sheet1`` with id 0, as Google makes."""
    props = req.body.get("properties") or {}
    specs = [spec.get("properties") or {} for spec in req.body.get("sheets") or []]
    titles = [str(sp.get("title") or f"Sheet{i + 1}") for i, sp in enumerate(specs)]
    ids = [sp.get("sheetId") for sp in specs]
    for i, title in enumerate(titles):  # validate first: a refused create leaves nothing behind
        if any(t.lower() == title.lower() for t in titles[:i]):
            raise invalid_argument(f'Invalid sheets[{i}]: A sheet with the name "{title}" already exists.')
        given = ids[i]
        if given is not None and (int(given) < 0 or given in ids[:i]):
            raise invalid_argument(f"Invalid sheets[{i}]: sheetId {ids[i]} is negative or used twice.")
    book = store.create(props.get("title", "Untitled spreadsheet"), [] if specs else None)
    for sp, title in zip(specs, titles, strict=True):
        given = sp.get("sheetId")
        sheet_id = int(given) if given is not None else _free_sheet_id(book, ids)
        sheet = book.add_sheet(title, sheet_id)
        grid = sp.get("gridProperties") or {}
        sheet.row_count = int(grid.get("rowCount", sheet.row_count))
        sheet.column_count = int(grid.get("columnCount", sheet.column_count))
    return book.resource()


def _free_sheet_id(book: Spreadsheet, reserved: list[Any]) -> int:
    """The smallest id not taken by a sheet made so far nor asked for by a later one."""
    taken = {s.sheet_id for s in book.sheets} | {int(i) for i in reserved if i is not None}
    return next(i for i in range(len(taken) + 1) if i not in taken)


# -- values ---------------------------------------------------------------------------------------


def values_get(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    dimension = _dimension(req.param("majorDimension"))
    option = _render_option(req.param("valueRenderOption"))
    return value_range(book.resolve(req.range), dimension, option)


def values_batch_get(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    dimension = _dimension(req.param("majorDimension"))
    option = _render_option(req.param("valueRenderOption"))
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id}
    ranges = req.params.get("ranges") or []
    if ranges:
        out["valueRanges"] = [value_range(book.resolve(r), dimension, option) for r in ranges]
    return out


def values_update(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    option = _input_option(req.param("valueInputOption"))
    body_range = req.body.get("range")
    # Google compares the resolved ranges, so "Queue!A1" and "queue!a1" agree.
    if (
        body_range
        and body_range != req.range
        and book.resolve(body_range, for_write=True).a1() != book.resolve(req.range, for_write=True).a1()
    ):
        raise invalid_argument(
            f"Requested range [{req.range}] and range in the body [{body_range}] do not match"
        )
    write = plan_write(book, req.range, req.body, option)
    write.apply()
    out = write.summary(book.spreadsheet_id)
    if req.flag("includeValuesInResponse"):
        out["updatedData"] = _updated_data(write, req)
    return out


def values_batch_update(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    option = _input_option(req.body.get("valueInputOption", ""))
    include = bool(req.body.get("includeValuesInResponse"))
    render_option = _render_option(req.body.get("responseValueRenderOption", ""))
    writes = [plan_write(book, d.get("range", ""), d, option) for d in req.body.get("data") or []]
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id}
    if not writes:
        return out
    responses = []
    for write in writes:
        write.apply()
    for write in writes:
        reply = write.summary(book.spreadsheet_id)
        if include:
            reply["updatedData"] = value_range(write.bounds(), "ROWS", render_option)
        responses.append(reply)
    out.update(batch_totals(writes))
    out["responses"] = responses
    return out


def values_append(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    option = _input_option(req.param("valueInputOption"))
    insert = req.param("insertDataOption", "OVERWRITE")
    if insert not in ("OVERWRITE", "INSERT_ROWS"):
        raise invalid_argument(f"Invalid value at 'insert_data_option' ({insert})")
    bounds = book.resolve(req.range, for_write=True)
    table = find_table(bounds)
    if table is None:
        anchor = Bounds(
            bounds.sheet, bounds.start_row, bounds.start_row + 1, bounds.start_col, bounds.start_col + 1
        )
    else:
        anchor = Bounds(bounds.sheet, table.end_row, table.end_row + 1, table.start_col, table.start_col + 1)
    write = plan_write(book, req.range, req.body, option, anchor=anchor)
    if insert == "INSERT_ROWS" and write.rows:
        bounds.sheet.insert_rows(anchor.start_row, write.rows)
    write.apply()
    updates = write.summary(book.spreadsheet_id)
    if req.flag("includeValuesInResponse"):
        updates["updatedData"] = _updated_data(write, req)
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id}
    if table is not None:
        out["tableRange"] = table.a1()
    out["updates"] = updates
    return out


def _clear(book: Spreadsheet, range_text: str) -> str:
    bounds = book.resolve(range_text, for_write=True)
    sheet = bounds.sheet
    end_row = min(bounds.end_row, sheet.row_count)
    end_col = min(bounds.end_col, sheet.column_count)
    for r in range(bounds.start_row, min(end_row, len(sheet.rows))):
        cells = sheet.rows[r]
        for c in range(bounds.start_col, min(end_col, len(cells))):
            cells[c] = None
        sheet.rows[r] = _trim(cells)
    return Bounds(sheet, bounds.start_row, end_row, bounds.start_col, end_col).a1()


def values_clear(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    book.resolve(req.range, for_write=True)
    return {"spreadsheetId": book.spreadsheet_id, "clearedRange": _clear(book, req.range)}


def values_batch_clear(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    ranges = req.body.get("ranges") or []
    for r in ranges:
        book.resolve(r, for_write=True)  # validate every range before clearing any
    out: dict[str, Any] = {"spreadsheetId": book.spreadsheet_id}
    if ranges:
        out["clearedRanges"] = [_clear(book, r) for r in ranges]
    return out
