"""Spreadsheet state (plain lists of lists) and its persistence to one JSON file.

The :class:`Store` owns one lock. The server holds it around "apply the request, then persist",
so every request is atomic with respect to every other, exactly what the claim protocol relies on.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.testing.sheets_emulator.a1 import A1Error, A1Range, format_a1, parse_a1, quote_title
from onceflow.testing.sheets_emulator.cells import Cell, Formula, from_json, to_json
from onceflow.testing.sheets_emulator.errors import ApiError, invalid_argument, not_found
from onceflow.testing.sheets_emulator.limits import METADATA_LIMIT

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_ROWS = 1000
DEFAULT_COLUMNS = 26
STATE_VERSION = 1


@dataclass
class Bounds:
    """A range resolved against one sheet: zero-based, half-open, inside the grid."""

    sheet: Sheet
    start_row: int
    end_row: int
    start_col: int
    end_col: int

    def a1(self) -> str:
        if self.end_row <= self.start_row or self.end_col <= self.start_col:
            return quote_title(self.sheet.title)
        return format_a1(self.sheet.title, self.start_row, self.end_row, self.start_col, self.end_col)


def grid_error(sheet: Sheet, start_row: int, end_row: int, start_col: int, end_col: int) -> ApiError:
    """Google's 400 for a range past the sheet's grid, e.g. ``Range ('Queue'!A1001) exceeds ...``."""
    cells = format_a1(sheet.title, start_row, end_row, start_col, end_col).rpartition("!")[2]
    title = sheet.title.replace("'", "''")
    return invalid_argument(
        f"Range ('{title}'!{cells}) exceeds grid limits. Max rows: {sheet.row_count}, "
        f"max columns: {sheet.column_count}"
    )


@dataclass
class DevMeta:
    """One piece of developer metadata.

    ``location_type`` is ``ROW``/``COLUMN`` (``index`` is the zero-based row or column, which moves
    when rows or columns are inserted, deleted or sorted), ``SHEET`` or ``SPREADSHEET``.
    """

    metadata_id: int
    key: str
    value: str | None
    visibility: str
    location_type: str
    sheet_id: int | None = None
    index: int | None = None

    def resource(self) -> dict[str, Any]:
        """The DeveloperMetadata JSON, as Google returns it."""
        location: dict[str, Any] = {"locationType": self.location_type}
        if self.location_type in ("ROW", "COLUMN"):
            assert self.index is not None
            location["dimensionRange"] = {
                "sheetId": self.sheet_id,
                "dimension": "ROWS" if self.location_type == "ROW" else "COLUMNS",
                "startIndex": self.index,
                "endIndex": self.index + 1,
            }
        elif self.location_type == "SHEET":
            location["sheetId"] = self.sheet_id
        else:
            location["spreadsheet"] = True
        out: dict[str, Any] = {
            "metadataId": self.metadata_id,
            "metadataKey": self.key,
            "location": location,
            "visibility": self.visibility,
        }
        if self.value is not None:
            out["metadataValue"] = self.value
        return out


@dataclass
class Sheet:
    """One tab. ``rows`` is ragged: rows and cells past the last written one are simply absent.

    ``metadata`` holds the developer metadata anchored to this sheet, its rows and its columns, so
    that inserting, deleting or sorting rows can carry row-anchored metadata along.
    """

    sheet_id: int
    title: str
    row_count: int = DEFAULT_ROWS
    column_count: int = DEFAULT_COLUMNS
    rows: list[list[Cell]] = field(default_factory=list)
    metadata: list[DevMeta] = field(default_factory=list)
    frozen_rows: int = 0
    frozen_columns: int = 0
    hidden: bool = False

    def get(self, row: int, col: int) -> Cell:
        if row < len(self.rows):
            cells = self.rows[row]
            if col < len(cells):
                return cells[col]
        return None

    def set(self, row: int, col: int, value: Cell) -> None:
        if value is None and self.get(row, col) is None:
            return
        if row >= len(self.rows):
            self.rows.extend([] for _ in range(row + 1 - len(self.rows)))
        cells = self.rows[row]
        if col >= len(cells):
            cells.extend([None] * (col + 1 - len(cells)))
        cells[col] = value
        self.grow(row + 1, col + 1)

    def grow(self, rows: int, cols: int) -> None:
        """Writes past the grid extend it, as values.update and values.append do in Google."""
        self.row_count = max(self.row_count, rows)
        self.column_count = max(self.column_count, cols)

    def block(self, b: Bounds) -> list[list[Cell]]:
        """Cells of the bounds, row-major, trailing empty cells and rows trimmed."""
        out: list[list[Cell]] = []
        for r in range(b.start_row, min(b.end_row, len(self.rows))):
            cells = self.rows[r][b.start_col : b.end_col]
            end = len(cells)
            while end and cells[end - 1] is None:
                end -= 1
            out.append(cells[:end])
        while out and not out[-1]:
            out.pop()
        return out

    def _shift(self, kind: str, start: int, count: int) -> None:
        # metadata anchored at or after an insertion moves with its row (or column)
        for m in self.metadata:
            if m.location_type == kind and m.index is not None and m.index >= start:
                m.index += count

    def _drop(self, kind: str, start: int, end: int) -> None:
        # metadata of deleted rows (columns) is deleted with them; the rest moves up (left)
        kept = []
        for m in self.metadata:
            if m.location_type == kind and m.index is not None:
                if start <= m.index < end:
                    continue
                if m.index >= end:
                    m.index -= end - start
            kept.append(m)
        self.metadata = kept

    def insert_rows(self, start: int, count: int) -> None:
        if start < len(self.rows):
            self.rows[start:start] = [[] for _ in range(count)]
        self.row_count += count
        self._shift("ROW", start, count)

    def delete_rows(self, start: int, end: int) -> None:
        del self.rows[start:end]
        self.row_count -= end - start
        self._drop("ROW", start, end)

    def insert_columns(self, start: int, count: int) -> None:
        for cells in self.rows:
            if start < len(cells):
                cells[start:start] = [None] * count
        self.column_count += count
        self._shift("COLUMN", start, count)

    def delete_columns(self, start: int, end: int) -> None:
        for cells in self.rows:
            del cells[start:end]
        self.column_count -= end - start
        self._drop("COLUMN", start, end)

    def permute_rows(self, start: int, order: list[int]) -> None:
        """Reorder rows ``start .. start+len(order)``: new row ``start+i`` is old row ``order[i]``.

        Row-anchored metadata goes with its row, as it does when Google sorts whole rows.
        """
        end = start + len(order)
        if len(self.rows) < end:
            self.rows.extend([] for _ in range(end - len(self.rows)))
        old = self.rows[start:end]
        self.rows[start:end] = [old[i - start] for i in order]
        where = {old_index: start + i for i, old_index in enumerate(order)}
        for m in self.metadata:
            if m.location_type == "ROW" and m.index is not None and m.index in where:
                m.index = where[m.index]
        while self.rows and not self.rows[-1]:
            self.rows.pop()

    def properties(self, index: int) -> dict[str, Any]:
        grid: dict[str, Any] = {"rowCount": self.row_count, "columnCount": self.column_count}
        # proto3 JSON leaves out zeros and false
        if self.frozen_rows:
            grid["frozenRowCount"] = self.frozen_rows
        if self.frozen_columns:
            grid["frozenColumnCount"] = self.frozen_columns
        out: dict[str, Any] = {
            "sheetId": self.sheet_id,
            "title": self.title,
            "index": index,
            "sheetType": "GRID",
            "gridProperties": grid,
        }
        if self.hidden:
            out["hidden"] = True
        return out


@dataclass
class Spreadsheet:
    spreadsheet_id: str
    title: str
    sheets: list[Sheet] = field(default_factory=list)
    locale: str = "en_US"
    time_zone: str = "Etc/GMT"
    #: spreadsheet-level developer metadata (row, column and sheet metadata live on their Sheet)
    metadata: list[DevMeta] = field(default_factory=list)
    #: developer metadata cap in characters, per spreadsheet and per sheet (``None``: no cap);
    #: set by the :class:`Store` from its setting, not persisted
    metadata_limit: int | None = METADATA_LIMIT

    def all_metadata(self) -> list[DevMeta]:
        """Every developer metadata entry of the spreadsheet, spreadsheet-level first."""
        return [*self.metadata, *(m for s in self.sheets for m in s.metadata)]

    def sheet_by_title(self, title: str) -> Sheet | None:
        for sheet in self.sheets:
            if sheet.title == title:
                return sheet
        # Google matches sheet titles in ranges case-insensitively.
        for sheet in self.sheets:
            if sheet.title.lower() == title.lower():
                return sheet
        return None

    def sheet_by_id(self, sheet_id: int) -> Sheet:
        for sheet in self.sheets:
            if sheet.sheet_id == sheet_id:
                return sheet
        raise invalid_argument(f"Invalid requests[0]: No grid with id: {sheet_id}")

    def next_sheet_id(self) -> int:
        return max((s.sheet_id for s in self.sheets), default=-1) + 1

    def add_sheet(self, title: str, sheet_id: int | None = None, index: int | None = None) -> Sheet:
        if self.sheet_by_title(title) is not None:
            raise invalid_argument(
                f'Invalid requests[0].addSheet: A sheet with the name "{title}" already exists. '
                "Please enter another name."
            )
        if sheet_id is None:
            sheet_id = self.next_sheet_id()
        elif any(s.sheet_id == sheet_id for s in self.sheets):
            raise invalid_argument(
                f"Invalid requests[0].addSheet: A sheet with the id {sheet_id} already exists."
            )
        sheet = Sheet(sheet_id=sheet_id, title=title)
        if index is None or index >= len(self.sheets):
            self.sheets.append(sheet)
        else:
            self.sheets.insert(max(index, 0), sheet)
        return sheet

    def resolve(self, text: str, *, for_write: bool = False) -> Bounds:
        """Resolve an A1 range against this spreadsheet.

        Ranges outside the grid fail like Google's ("exceeds grid limits") unless ``for_write``
        (append and clear, which Google lets grow the sheet or clip).

        :param text: A1 range, percent-decoded.
        :param for_write: whether the caller will write (open ends then still stop at the grid).
        """
        try:
            rng = parse_a1(text)
        except A1Error:
            raise invalid_argument(f"Unable to parse range: {text}") from None
        return self.bounds(rng, text, for_write=for_write)

    def bounds(self, rng: A1Range, text: str, *, for_write: bool = False) -> Bounds:
        if rng.sheet is None:
            sheet = self.sheets[0]
        else:
            found = self.sheet_by_title(rng.sheet)
            if found is None:
                raise invalid_argument(f"Unable to parse range: {text}")
            sheet = found
        end_row = sheet.row_count if rng.end_row is None else rng.end_row
        end_col = sheet.column_count if rng.end_col is None else rng.end_col
        outside = end_row > sheet.row_count or end_col > sheet.column_count
        outside = outside or rng.start_row >= sheet.row_count or rng.start_col >= sheet.column_count
        if not for_write and outside:
            raise grid_error(sheet, rng.start_row, end_row, rng.start_col, end_col)
        return Bounds(sheet, rng.start_row, end_row, rng.start_col, end_col)

    def resource(self) -> dict[str, Any]:
        return {
            "spreadsheetId": self.spreadsheet_id,
            "properties": {
                "title": self.title,
                "locale": self.locale,
                "autoRecalc": "ON_CHANGE",
                "timeZone": self.time_zone,
            },
            "sheets": [_sheet_resource(s, i) for i, s in enumerate(self.sheets)],
            **({"developerMetadata": [m.resource() for m in self.metadata]} if self.metadata else {}),
            "spreadsheetUrl": f"https://docs.google.com/spreadsheets/d/{self.spreadsheet_id}/edit",
        }


def _sheet_resource(sheet: Sheet, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"properties": sheet.properties(index)}
    # sheet-level metadata is listed on the sheet; row and column metadata only with grid data
    on_sheet = [m.resource() for m in sheet.metadata if m.location_type == "SHEET"]
    if on_sheet:
        out["developerMetadata"] = on_sheet
    return out


class Store:
    """All spreadsheets of one emulator, the lock that serialises requests, and the state file.

    :param path: JSON state file; ``None`` keeps state in memory only.
    :param metadata_limit: developer metadata cap in characters per spreadsheet and per sheet
        (Google's 30,000 by default); ``None`` turns it off.
    """

    def __init__(self, path: str | Path | None = None, metadata_limit: int | None = METADATA_LIMIT) -> None:
        self.path = None if path is None else os.fspath(path)
        self.metadata_limit = metadata_limit
        self.lock = threading.RLock()
        self.spreadsheets: dict[str, Spreadsheet] = {}
        self._encoded: dict[str, str] = {}  # spreadsheet id -> its JSON as last saved
        if self.path and os.path.exists(self.path):
            self._load()

    def get(self, spreadsheet_id: str) -> Spreadsheet:
        found = self.spreadsheets.get(spreadsheet_id)
        if found is None:
            raise not_found()
        found.metadata_limit = self.metadata_limit
        return found

    def create(
        self, title: str, sheet_titles: list[str] | None = None, spreadsheet_id: str | None = None
    ) -> Spreadsheet:
        """Create a spreadsheet with exactly ``sheet_titles``; ``None`` gives one ``Sheet1`` (id 0),
        as Google does for a create without ``sheets``."""
        if spreadsheet_id is None:
            spreadsheet_id = secrets.token_urlsafe(33)[:44]
        elif spreadsheet_id in self.spreadsheets:
            raise ApiError(409, "ALREADY_EXISTS", f"Spreadsheet {spreadsheet_id} already exists.")
        book = Spreadsheet(spreadsheet_id=spreadsheet_id, title=title, metadata_limit=self.metadata_limit)
        for sheet_title in ["Sheet1"] if sheet_titles is None else sheet_titles:
            book.add_sheet(sheet_title)
        self.spreadsheets[spreadsheet_id] = book
        return book

    # -- persistence ---------------------------------------------------------------------------

    def save(self, changed: str | None = None) -> None:
        """Write the whole state atomically: a temp file in the same directory, then os.replace.

        Each spreadsheet's JSON is cached, so a write re-encodes only the spreadsheet it changed.

        :param changed: id of the only spreadsheet that changed since the last save; ``None``
            re-encodes all of them.
        """
        if not self.path:
            return
        if changed is None:
            self._encoded.clear()
        else:
            self._encoded.pop(changed, None)
        parts = []
        for sid, book in self.spreadsheets.items():
            if sid not in self._encoded:
                self._encoded[sid] = json.dumps(_dump(book), separators=(",", ":"))
            parts.append(self._encoded[sid])
        text = f'{{"version":{STATE_VERSION},"spreadsheets":[{",".join(parts)}]}}'
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".sheets-state-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _load(self) -> None:
        assert self.path is not None
        with open(self.path, encoding="utf-8") as f:
            data = json.load(f)
        for raw in data.get("spreadsheets", []):
            book = _load(raw)
            self.spreadsheets[book.spreadsheet_id] = book


def _dump(book: Spreadsheet) -> dict[str, Any]:
    return {
        "spreadsheetId": book.spreadsheet_id,
        "title": book.title,
        "locale": book.locale,
        "timeZone": book.time_zone,
        "sheets": [
            {
                "sheetId": s.sheet_id,
                "title": s.title,
                "rowCount": s.row_count,
                "columnCount": s.column_count,
                "rows": [_dump_row(row) for row in s.rows],
                "metadata": [_dump_meta(m) for m in s.metadata],
                "frozenRows": s.frozen_rows,
                "frozenColumns": s.frozen_columns,
                "hidden": s.hidden,
            }
            for s in book.sheets
        ],
        "metadata": [_dump_meta(m) for m in book.metadata],
    }


def _dump_meta(m: DevMeta) -> dict[str, Any]:
    return {
        "id": m.metadata_id,
        "key": m.key,
        "value": m.value,
        "visibility": m.visibility,
        "type": m.location_type,
        "sheetId": m.sheet_id,
        "index": m.index,
    }


def _load_meta(raw: dict[str, Any]) -> DevMeta:
    return DevMeta(
        raw["id"], raw["key"], raw["value"], raw["visibility"], raw["type"], raw["sheetId"], raw["index"]
    )


def _dump_row(row: list[Cell]) -> list[Any]:
    # Most rows hold no formula and can go to the C encoder as they are.
    if any(isinstance(c, Formula) for c in row):
        return [to_json(c) for c in row]
    return row


def _load(raw: dict[str, Any]) -> Spreadsheet:
    book = Spreadsheet(
        spreadsheet_id=raw["spreadsheetId"],
        title=raw["title"],
        locale=raw.get("locale", "en_US"),
        time_zone=raw.get("timeZone", "Etc/GMT"),
        metadata=[_load_meta(m) for m in raw.get("metadata", [])],
    )
    for s in raw["sheets"]:
        book.sheets.append(
            Sheet(
                sheet_id=s["sheetId"],
                title=s["title"],
                row_count=s["rowCount"],
                column_count=s["columnCount"],
                rows=[[from_json(c) for c in row] for row in s["rows"]],
                metadata=[_load_meta(m) for m in s.get("metadata", [])],
                frozen_rows=s.get("frozenRows", 0),
                frozen_columns=s.get("frozenColumns", 0),
                hidden=s.get("hidden", False),
            )
        )
    return book
