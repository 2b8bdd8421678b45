"""``spreadsheets.get`` with grid data, and the ``fields`` mask (partial response), as Google does.

Google documents (``spreadsheets.get``): grid data is returned either when a field mask lists it
or, with no mask, when ``includeGridData=true`` ("if a field mask is set, the includeGridData
parameter is ignored"); ``ranges`` limits the reply to the sheets, and the parts of them, the
ranges intersect: one ``GridData`` per range on its sheet, whose ``startRow``/``startColumn`` are
the range's (zero-based, omitted when 0, as proto3 JSON omits zeros). The mask's syntax (its
field-mask guide): fields comma-separated, subfields dot-separated, several subfields of one
type in parentheses, names in camelCase or snake_case, e.g.
``sheets(properties(sheetId,title),data(rowData(values(userEnteredValue))))``.

Per row and column (``DimensionProperties``): ``pixelSize`` and the ``developerMetadata`` anchored
to that row or column. Per cell (``CellData``): ``userEnteredValue`` (``stringValue``, ``numberValue``, ``boolValue``,
``formulaValue``), ``effectiveValue`` (the same, except that a formula, never evaluated here, has
none) and ``formattedValue``. ``rowData`` stops at the range's last row holding a value, and each
row's ``values`` at its last cell holding one; empty cells before are ``{}``, empty rows before
are ``{}`` (Google leaves an empty message empty).
"""

from __future__ import annotations

import re
from typing import Any

from onceflow.testing.sheets_emulator.cells import Cell, Formula, formatted
from onceflow.testing.sheets_emulator.errors import invalid_argument
from onceflow.testing.sheets_emulator.model import Bounds, Spreadsheet

#: a parsed mask: field name -> the mask of its subfields (``None``: the whole field)
Mask = dict[str, "Mask | None"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\*")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def parse_mask(text: str) -> Mask:
    """``a.b(c,d),e`` -> ``{"a": {"b": {"c": None, "d": None}}, "e": None}``.

    :raises ApiError: 400 ``Invalid field selection`` for text that is not a mask.
    """
    pos = 0

    def fail() -> Exception:
        return invalid_argument(f"Invalid field selection {text}")

    def merge(into: Mask, name: str, sub: Mask | None) -> None:
        if name in into and into[name] is None:
            return  # the whole field is already selected
        if sub is None or name not in into:
            into[name] = sub
            return
        current = into[name]
        assert current is not None
        for key, value in sub.items():
            merge(current, key, value)

    def selection(stop: str) -> Mask:
        nonlocal pos
        out: Mask = {}
        while True:
            path: list[str] = []
            while True:
                match = _NAME.match(text, pos)
                if match is None:
                    raise fail()
                path.append(_camel(match.group()))
                pos = match.end()
                if pos < len(text) and text[pos] in "./":
                    pos += 1
                    continue
                break
            sub: Mask | None = None
            if pos < len(text) and text[pos] == "(":
                pos += 1
                sub = selection(")")
                pos += 1  # the ")"
            for name in reversed(path[1:]):
                sub = {name: sub}
            merge(out, path[0], sub)
            if pos < len(text) and text[pos] == ",":
                pos += 1
                continue
            if stop == ")":
                if pos >= len(text) or text[pos] != ")":
                    raise fail()
            elif pos != len(text):
                raise fail()
            return out

    if not text.strip():
        raise fail()
    return selection("")


def apply_mask(value: Any, mask: Mask | None) -> Any:
    """``value`` with only the fields ``mask`` selects (lists: each element); ``None`` is all."""
    if mask is None or "*" in mask:
        return value
    if isinstance(value, list):
        return [apply_mask(v, mask) for v in value]
    if not isinstance(value, dict):
        return value
    return {k: apply_mask(value[k], sub) for k, sub in mask.items() if k in value}


def wants_grid_data(mask: Mask | None, include: bool) -> bool:
    """Whether the reply carries grid data: the mask lists ``sheets.data``, or, with no mask,
    ``includeGridData`` is true."""
    if mask is None:
        return include
    sheets = mask.get("sheets", {}) if "*" not in mask else None
    return sheets is None or "*" in sheets or "data" in sheets


def _extended(cell: Cell) -> dict[str, Any]:
    if isinstance(cell, Formula):
        return {"formulaValue": str(cell)}
    if isinstance(cell, bool):
        return {"boolValue": cell}
    if isinstance(cell, (int, float)):
        return {"numberValue": cell}
    return {"stringValue": str(cell)}


def cell_data(cell: Cell) -> dict[str, Any]:
    """The ``CellData`` of one stored cell (``{}`` when empty)."""
    if cell is None:
        return {}
    out: dict[str, Any] = {"userEnteredValue": _extended(cell)}
    if not isinstance(cell, Formula):  # never evaluated here: no effective value
        out["effectiveValue"] = _extended(cell)
    out["formattedValue"] = formatted(cell)
    return out


def grid_data(bounds: Bounds) -> dict[str, Any]:
    """The ``GridData`` of ``bounds``: its cells from its start, trailing empties left out."""
    out: dict[str, Any] = {}
    if bounds.start_row:
        out["startRow"] = bounds.start_row
    if bounds.start_col:
        out["startColumn"] = bounds.start_col
    rows = [[cell_data(c) for c in row] for row in bounds.sheet.block(bounds)]
    if rows:
        out["rowData"] = [{"values": row} if row else {} for row in rows]
    out["rowMetadata"] = [{"pixelSize": 21} for _ in range(bounds.end_row - bounds.start_row)]
    out["columnMetadata"] = [{"pixelSize": 100} for _ in range(bounds.end_col - bounds.start_col)]
    # DimensionProperties.developerMetadata: "the developer metadata associated with a single row
    # or column", on the entry of the row (column) it is anchored to
    for meta in bounds.sheet.metadata:
        if meta.location_type in ("ROW", "COLUMN") and meta.index is not None:
            along, start, end = (
                ("rowMetadata", bounds.start_row, bounds.end_row)
                if meta.location_type == "ROW"
                else ("columnMetadata", bounds.start_col, bounds.end_col)
            )
            if start <= meta.index < end:
                out[along][meta.index - start].setdefault("developerMetadata", []).append(meta.resource())
    return out


def with_grid_data(book: Spreadsheet, resource: dict[str, Any], ranges: list[str]) -> None:
    """Put each sheet's ``data`` into ``resource``: one GridData per range on it (the whole
    sheet when no range is given)."""
    bounds = [book.resolve(r) for r in ranges] or [
        Bounds(s, 0, s.row_count, 0, s.column_count) for s in book.sheets
    ]
    for sheet in resource.get("sheets", []):
        sheet_id = sheet["properties"]["sheetId"]
        sheet["data"] = [grid_data(b) for b in bounds if b.sheet.sheet_id == sheet_id]
