"""Developer metadata: ``create``/``update``/``deleteDeveloperMetadata`` (in ``spreadsheets.batchUpdate``),
``developerMetadata.get`` and ``.search``, and the ``values.*ByDataFilter`` methods.

Row- and column-anchored metadata lives on its :class:`~.model.Sheet` and moves with its row or
column when rows or columns are inserted, deleted or sorted (``model.Sheet``), and is deleted with
it, which is what Google documents. A DataFilter selects cells three ways: an A1 range, a GridRange,
or a ``developerMetadataLookup``, which selects the whole row (column, sheet) each matching
metadata is anchored to *now*, wherever it has moved.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from onceflow.testing.sheets_emulator import limits
from onceflow.testing.sheets_emulator.errors import ApiError, invalid_argument, not_found
from onceflow.testing.sheets_emulator.model import Bounds, DevMeta, Sheet, Spreadsheet

if TYPE_CHECKING:
    from onceflow.testing.sheets_emulator.handlers import ApiRequest
    from onceflow.testing.sheets_emulator.model import Store

VISIBILITIES = ("DOCUMENT", "PROJECT")
LOCATION_TYPES = ("ROW", "COLUMN", "SHEET", "SPREADSHEET")
_ids = random.Random()


class MetaFail(Exception):
    """A request-level error inside a batchUpdate request (prefixed by the caller)."""


# -- locations --------------------------------------------------------------------------------------


def parse_location(book: Spreadsheet, loc: dict[str, Any]) -> tuple[str, int | None, int | None]:
    """A DeveloperMetadataLocation -> (location type, sheet id, row/column index)."""
    if "dimensionRange" in loc:
        dr = loc["dimensionRange"] or {}
        sheet = book.sheet_by_id(int(dr.get("sheetId", 0)))
        dimension = dr.get("dimension", "")
        if dimension not in ("ROWS", "COLUMNS"):
            raise MetaFail("dimensionRange.dimension must be ROWS or COLUMNS")
        if "startIndex" not in dr or "endIndex" not in dr:
            raise MetaFail("The dimension range of developer metadata cannot be unbounded.")
        start, end = int(dr["startIndex"]), int(dr["endIndex"])
        if end != start + 1:
            raise MetaFail("Developer metadata may only be associated with a single row or column.")
        size = sheet.row_count if dimension == "ROWS" else sheet.column_count
        if start < 0 or start >= size:
            raise MetaFail(f"Index {start} is out of bounds of the sheet ({size} {dimension.lower()}).")
        return ("ROW" if dimension == "ROWS" else "COLUMN"), sheet.sheet_id, start
    if loc.get("sheetId") is not None:
        return "SHEET", book.sheet_by_id(int(loc["sheetId"])).sheet_id, None
    if loc.get("spreadsheet"):
        return "SPREADSHEET", None, None
    raise MetaFail("Developer metadata must have a location (dimensionRange, sheetId or spreadsheet).")


def _intersects(meta: DevMeta, sheet: Sheet, r0: int, r1: int, c0: int, c1: int) -> bool:
    """Whether ``meta``'s location touches the cells ``[r0, r1) x [c0, c1)`` of ``sheet``."""
    if meta.sheet_id != sheet.sheet_id or meta.location_type == "SPREADSHEET":
        return False
    if meta.location_type == "SHEET":
        return True
    assert meta.index is not None
    if meta.location_type == "ROW":
        return r0 <= meta.index < r1
    return c0 <= meta.index < c1


def meta_bounds(book: Spreadsheet, meta: DevMeta) -> Bounds | None:
    """The cells a metadata entry selects: its whole row, column or sheet (None: spreadsheet)."""
    if meta.location_type == "SPREADSHEET" or meta.sheet_id is None:
        return None
    sheet = book.sheet_by_id(meta.sheet_id)
    if meta.location_type == "ROW":
        assert meta.index is not None
        return Bounds(sheet, meta.index, meta.index + 1, 0, sheet.column_count)
    if meta.location_type == "COLUMN":
        assert meta.index is not None
        return Bounds(sheet, 0, sheet.row_count, meta.index, meta.index + 1)
    return Bounds(sheet, 0, sheet.row_count, 0, sheet.column_count)


# -- lookups and data filters ------------------------------------------------------------------------


def lookup(book: Spreadsheet, spec: dict[str, Any]) -> list[DevMeta]:
    """Metadata matching every field of a DeveloperMetadataLookup (an empty lookup is an error)."""
    fields = {k for k, v in spec.items() if v not in (None, "")}
    if not fields:
        raise MetaFail("A developer metadata lookup must specify at least one criterion.")
    found = book.all_metadata()
    if "metadataId" in fields:
        found = [m for m in found if m.metadata_id == int(spec["metadataId"])]
    if "metadataKey" in fields:
        found = [m for m in found if m.key == spec["metadataKey"]]
    if "metadataValue" in fields:
        found = [m for m in found if m.value == spec["metadataValue"]]
    visibility = spec.get("visibility", "DEVELOPER_METADATA_VISIBILITY_UNSPECIFIED")
    if visibility not in ("", "DEVELOPER_METADATA_VISIBILITY_UNSPECIFIED"):
        found = [m for m in found if m.visibility == visibility]
    location_type = spec.get("locationType", "DEVELOPER_METADATA_LOCATION_TYPE_UNSPECIFIED")
    if location_type not in ("", "DEVELOPER_METADATA_LOCATION_TYPE_UNSPECIFIED"):
        found = [m for m in found if m.location_type == location_type]
    if spec.get("metadataLocation"):
        kind, sheet_id, index = parse_location(book, spec["metadataLocation"])
        strategy = spec.get("locationMatchingStrategy") or "INTERSECTING_LOCATION"
        if strategy == "EXACT_LOCATION" or kind == "SPREADSHEET":
            found = [m for m in found if (m.location_type, m.sheet_id, m.index) == (kind, sheet_id, index)]
        else:
            assert sheet_id is not None
            sheet = book.sheet_by_id(sheet_id)
            if kind == "ROW":
                assert index is not None
                box = (index, index + 1, 0, sheet.column_count)
            elif kind == "COLUMN":
                assert index is not None
                box = (0, sheet.row_count, index, index + 1)
            else:
                box = (0, sheet.row_count, 0, sheet.column_count)
            found = [m for m in found if _intersects(m, sheet, *box)]
    return found


def _grid_box(book: Spreadsheet, grid: dict[str, Any]) -> Bounds:
    sheet = book.sheet_by_id(int(grid.get("sheetId", 0)))
    r0 = int(grid.get("startRowIndex", 0))
    r1 = min(int(grid.get("endRowIndex", sheet.row_count)), sheet.row_count)
    c0 = int(grid.get("startColumnIndex", 0))
    c1 = min(int(grid.get("endColumnIndex", sheet.column_count)), sheet.column_count)
    return Bounds(sheet, r0, r1, c0, c1)


def _one_kind(data_filter: dict[str, Any]) -> str:
    kinds = [k for k in ("developerMetadataLookup", "a1Range", "gridRange") if data_filter.get(k)]
    if len(kinds) != 1:
        raise invalid_argument(
            "A DataFilter must set exactly one of developerMetadataLookup, a1Range or gridRange."
        )
    return kinds[0]


def filter_ranges(book: Spreadsheet, data_filter: dict[str, Any]) -> list[Bounds]:
    """The cell ranges a DataFilter selects, in metadata order for lookups."""
    kind = _one_kind(data_filter)
    try:
        if kind == "a1Range":
            return [book.resolve(data_filter["a1Range"])]
        if kind == "gridRange":
            return [_grid_box(book, data_filter["gridRange"])]
        found = lookup(book, data_filter["developerMetadataLookup"])
    except MetaFail as exc:
        raise invalid_argument(str(exc)) from None
    out = []
    for meta in found:
        bounds = meta_bounds(book, meta)
        if bounds is not None:
            out.append(bounds)
    return out


def filter_metadata(book: Spreadsheet, data_filter: dict[str, Any]) -> list[DevMeta]:
    """The metadata a DataFilter selects: by lookup, or every entry whose location intersects."""
    kind = _one_kind(data_filter)
    if kind == "developerMetadataLookup":
        return lookup(book, data_filter["developerMetadataLookup"])
    box = (
        book.resolve(data_filter["a1Range"])
        if kind == "a1Range"
        else _grid_box(book, data_filter["gridRange"])
    )
    return [
        m
        for m in box.sheet.metadata
        if _intersects(m, box.sheet, box.start_row, box.end_row, box.start_col, box.end_col)
    ]


# -- batchUpdate requests ----------------------------------------------------------------------------


def _new_id(book: Spreadsheet) -> int:
    taken = {m.metadata_id for m in book.all_metadata()}
    while True:  # Google assigns random positive int32 ids
        candidate = _ids.randint(1, 2**31 - 1)
        if candidate not in taken:
            return candidate


def create_developer_metadata(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    dm = spec.get("developerMetadata") or {}
    key = dm.get("metadataKey")
    if not key:
        raise MetaFail("Developer metadata must always have a key specified.")
    visibility = dm.get("visibility", "")
    if visibility not in VISIBILITIES:
        raise MetaFail("Developer metadata must always have a visibility specified.")
    kind, sheet_id, index = parse_location(book, dm.get("location") or {})
    if "metadataId" in dm and dm["metadataId"] is not None:
        metadata_id = int(dm["metadataId"])
        if metadata_id <= 0:
            raise MetaFail("metadataId must be positive.")
        if any(m.metadata_id == metadata_id for m in book.all_metadata()):
            raise MetaFail(f"Duplicate developer metadata ID: {metadata_id}")
    else:
        metadata_id = _new_id(book)
    meta = DevMeta(metadata_id, str(key), dm.get("metadataValue"), visibility, kind, sheet_id, index)
    over = limits.excess(book, [(None if kind == "SPREADSHEET" else sheet_id, limits.size(meta))])
    if over is not None:
        raise MetaFail(over)
    if kind == "SPREADSHEET":
        book.metadata.append(meta)
    else:
        assert sheet_id is not None
        book.sheet_by_id(sheet_id).metadata.append(meta)
    return {"createDeveloperMetadata": {"developerMetadata": meta.resource()}}


def _remove(book: Spreadsheet, doomed: list[DevMeta]) -> None:
    ids = {m.metadata_id for m in doomed}
    book.metadata = [m for m in book.metadata if m.metadata_id not in ids]
    for sheet in book.sheets:
        sheet.metadata = [m for m in sheet.metadata if m.metadata_id not in ids]


def delete_developer_metadata(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    data_filter = spec.get("dataFilter")
    if not data_filter:
        raise MetaFail("A dataFilter is required.")
    try:
        doomed = filter_metadata(book, data_filter)
    except ApiError as exc:
        raise MetaFail(exc.message) from None
    _remove(book, doomed)
    reply: dict[str, Any] = {}
    if doomed:  # proto3 JSON omits an empty repeated field
        reply["deletedDeveloperMetadata"] = [m.resource() for m in doomed]
    return {"deleteDeveloperMetadata": reply}


_UPDATABLE = ("metadataKey", "metadataValue", "visibility", "location")


def update_developer_metadata(book: Spreadsheet, spec: dict[str, Any]) -> dict[str, Any]:
    filters = spec.get("dataFilters") or []
    if not filters:
        raise MetaFail("At least one dataFilter is required.")
    fields_text = spec.get("fields", "")
    if not fields_text:
        raise MetaFail("At least one field must be updated, but none were specified in 'fields'.")
    fields = list(_UPDATABLE) if fields_text.strip() == "*" else [f.strip() for f in fields_text.split(",")]
    unknown = [f for f in fields if f not in _UPDATABLE]
    if unknown:
        raise MetaFail(f"Unknown or read-only developer metadata field(s): {', '.join(unknown)}")
    new = spec.get("developerMetadata") or {}
    matched: dict[int, DevMeta] = {}
    try:
        for data_filter in filters:
            for m in filter_metadata(book, data_filter):
                matched.setdefault(m.metadata_id, m)
    except ApiError as exc:
        raise MetaFail(exc.message) from None
    location = parse_location(book, new["location"]) if "location" in fields else None
    if "metadataKey" in fields and not new.get("metadataKey"):
        raise MetaFail("Developer metadata must always have a key specified.")
    if "visibility" in fields and new.get("visibility") not in VISIBILITIES:
        raise MetaFail("Developer metadata must always have a visibility specified.")
    over = limits.excess(
        book, [_updated_size(m, new, fields, location) for m in matched.values()], list(matched.values())
    )
    if over is not None:
        raise MetaFail(over)
    for m in matched.values():
        if "metadataKey" in fields:
            m.key = str(new["metadataKey"])
        if "metadataValue" in fields:
            m.value = new.get("metadataValue")
        if "visibility" in fields:
            m.visibility = new["visibility"]
        if location is not None:
            _remove(book, [m])
            m.location_type, m.sheet_id, m.index = location
            if m.location_type == "SPREADSHEET":
                book.metadata.append(m)
            else:
                assert m.sheet_id is not None
                book.sheet_by_id(m.sheet_id).metadata.append(m)
    reply: dict[str, Any] = {}
    if matched:
        reply["developerMetadata"] = [m.resource() for m in matched.values()]
    return {"updateDeveloperMetadata": reply}


def _updated_size(
    meta: DevMeta, new: dict[str, Any], fields: list[str], location: tuple[str, int | None, int | None] | None
) -> tuple[int | None, int]:
    """(sheet id charged, characters) of ``meta`` once the update is applied."""
    key = str(new["metadataKey"]) if "metadataKey" in fields else meta.key
    value = new.get("metadataValue") if "metadataValue" in fields else meta.value
    kind, sheet_id = (
        (location[0], location[1]) if location is not None else (meta.location_type, meta.sheet_id)
    )
    return (None if kind == "SPREADSHEET" else sheet_id), len(key) + len(value or "")


# -- developerMetadata.get / .search -----------------------------------------------------------------


def developer_metadata_get(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    try:
        wanted = int(req.range)
    except ValueError:
        raise invalid_argument(f"Invalid value at 'metadata_id' ({req.range})") from None
    for m in book.all_metadata():
        if m.metadata_id == wanted:
            return m.resource()
    raise not_found()


def developer_metadata_search(store: Store, req: ApiRequest) -> dict[str, Any]:
    book = store.get(req.spreadsheet_id)
    filters = req.body.get("dataFilters") or []
    matched: dict[int, tuple[DevMeta, list[dict[str, Any]]]] = {}
    for data_filter in filters:
        try:
            found = filter_metadata(book, data_filter)
        except MetaFail as exc:
            raise invalid_argument(str(exc)) from None
        for m in found:
            matched.setdefault(m.metadata_id, (m, []))[1].append(data_filter)
    out: dict[str, Any] = {}
    if matched:
        out["matchedDeveloperMetadata"] = [
            {"developerMetadata": m.resource(), "dataFilters": fs} for m, fs in matched.values()
        ]
    return out
