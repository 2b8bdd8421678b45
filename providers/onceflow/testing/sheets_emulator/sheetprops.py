"""``spreadsheets.batchUpdate``'s ``updateSheetProperties``: rename, move, resize, freeze, hide.

The request carries ``properties`` (``sheetId`` picks the tab) and ``fields``, the mask of what to
change: comma-separated paths under ``properties`` (which is implied), dot-separated below it
(``title,gridProperties.frozenRowCount``); ``gridProperties`` alone means all of its fields; ``*``
means every field. A field in the mask but absent from ``properties`` is set to its default (0,
false, empty), as a field mask does, so ``*`` with only a title clears the frozen rows and moves
the tab to the end (Google's rule for an absent ``index``); an empty title or a grid of no rows is
refused. ``index`` counts "before the move", as Google documents: of three tabs, moving the first
ahead of the third takes index 2, and an index equal to the tab's own or one more changes nothing.
Everything is checked before anything changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.testing.sheets_emulator.model import Sheet, Spreadsheet

_GRID = ("rowCount", "columnCount", "frozenRowCount", "frozenColumnCount")
FIELDS = ("title", "index", "hidden", *(f"gridProperties.{name}" for name in _GRID))
# SheetProperties fields Google has and the emulator does not model: refused, never ignored
_UNMODELLED = ("tabColor", "tabColorStyle", "rightToLeft", "sheetType", "dataSourceSheetProperties")


class PropsFail(Exception):
    """Why the request is refused; the batch prefixes ``Invalid requests[i].updateSheetProperties:``."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def mask_paths(fields: str) -> list[str]:
    """The mask as a list of :data:`FIELDS` (``*`` and ``gridProperties`` expanded)."""
    if not fields.strip():
        raise PropsFail("At least one field must be updated, but none were specified in 'fields'.")
    if fields.strip() == "*":
        return list(FIELDS)
    paths: list[str] = []
    for raw in fields.split(","):
        path = ".".join(_camel(part.strip()) for part in raw.strip().split("."))
        if path == "gridProperties":
            paths += [f"gridProperties.{name}" for name in _GRID]
        elif path in FIELDS:
            paths.append(path)
        elif path != "sheetId":  # the tab's id selects it; it is never changed
            known = path.split(".")[0] in _UNMODELLED or path.startswith("gridProperties.")
            reason = "is not supported by the onceflow Sheets emulator" if known else "is not a field of it"
            raise PropsFail(f"Invalid field mask path {path!r}: {reason}")
    return paths


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PropsFail(f"Invalid value at 'properties.{name}' ({value!r})")
    try:
        return int(value)
    except ValueError:
        raise PropsFail(f"Invalid value at 'properties.{name}' ({value!r})") from None


def _new_position(book: Spreadsheet, sheet: Sheet, index: Any) -> int:
    """Where the tab ends up in the list once taken out and put back."""
    current = book.sheets.index(sheet)
    target = len(book.sheets) if index is None else _int(index, "index")
    if target < 0:
        raise PropsFail(f"Invalid index {target}: it must not be negative")
    target = min(target, len(book.sheets))
    return target - 1 if target > current else target


def update_sheet_properties(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    props = spec.get("properties") or {}
    sheet = book.sheet_by_id(_int(props.get("sheetId", 0), "sheetId"))
    paths = mask_paths(str(spec.get("fields") or ""))
    grid = props.get("gridProperties") or {}

    def wanted(path: str, current: Any, default: Any) -> Any:
        if path not in paths:
            return current
        name = path.rpartition(".")[2]
        return (grid if path.startswith("gridProperties.") else props).get(name, default)

    title = str(wanted("title", sheet.title, ""))
    if not title:
        raise PropsFail("A sheet's title must not be empty.")
    if any(s is not sheet and s.title.lower() == title.lower() for s in book.sheets):
        raise PropsFail(f'A sheet with the name "{title}" already exists. Please enter another name.')
    rows = _int(wanted("gridProperties.rowCount", sheet.row_count, 0), "gridProperties.rowCount")
    cols = _int(wanted("gridProperties.columnCount", sheet.column_count, 0), "gridProperties.columnCount")
    if rows < 1 or cols < 1:
        raise PropsFail("A sheet must keep at least one row and one column.")
    frozen_rows = _int(wanted("gridProperties.frozenRowCount", sheet.frozen_rows, 0), "frozenRowCount")
    frozen_cols = _int(
        wanted("gridProperties.frozenColumnCount", sheet.frozen_columns, 0), "frozenColumnCount"
    )
    if frozen_rows < 0 or frozen_cols < 0:
        raise PropsFail("Frozen row and column counts must not be negative.")
    if frozen_rows >= rows:
        raise PropsFail("You can't freeze all visible rows on the sheet.")
    if frozen_cols >= cols:
        raise PropsFail("You can't freeze all visible columns on the sheet.")
    hidden = bool(wanted("hidden", sheet.hidden, False))
    if hidden and all(s.hidden for s in book.sheets if s is not sheet):
        raise PropsFail("You can't hide all the sheets in a document.")
    position = _new_position(book, sheet, props.get("index")) if "index" in paths else None

    sheet.title, sheet.hidden = title, hidden
    sheet.frozen_rows, sheet.frozen_columns = frozen_rows, frozen_cols
    if rows < sheet.row_count:  # shrinking drops the rows past the end, and their metadata
        sheet.delete_rows(rows, sheet.row_count)
    if cols < sheet.column_count:
        sheet.delete_columns(cols, sheet.column_count)
    sheet.row_count, sheet.column_count = rows, cols
    if position is not None:
        book.sheets.remove(sheet)
        book.sheets.insert(position, sheet)
    return {}
