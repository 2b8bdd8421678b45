"""Google's developer metadata size cap: 30,000 characters per spreadsheet and per sheet.

Google's metadata guide caps the developer metadata a spreadsheet may hold, and the metadata each of
its sheets may hold, at 30,000 characters each; a request that would pass either is refused with a
400 ``INVALID_ARGUMENT`` and nothing of its batch is applied. We count a metadata entry as the
characters of its key plus its value, and charge it to its sheet (row, column and sheet metadata)
and to the spreadsheet (every entry, wherever it is anchored): the stricter reading of "per
spreadsheet", so code that stays under the emulator's cap stays under Google's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from onceflow.testing.sheets_emulator.model import DevMeta, Spreadsheet

#: Google's figure, in characters, for one spreadsheet and for one sheet.
METADATA_LIMIT = 30_000


def size(meta: DevMeta) -> int:
    """Characters one entry uses: its key plus its value."""
    return len(meta.key) + len(meta.value or "")


def usage(book: Spreadsheet) -> dict[int | None, int]:
    """Characters used per sheet id, and under ``None`` by the whole spreadsheet."""
    used: dict[int | None, int] = {None: sum(size(m) for m in book.metadata)}
    for sheet in book.sheets:
        on_sheet = sum(size(m) for m in sheet.metadata)
        used[sheet.sheet_id] = on_sheet
        used[None] += on_sheet
    return used


def excess(
    book: Spreadsheet, added: Sequence[tuple[int | None, int]], removed: Sequence[DevMeta] = ()
) -> str | None:
    """Why a change would take the spreadsheet or a sheet past the cap, or ``None`` if it fits.

    :param added: (sheet id or ``None`` for spreadsheet-level, characters) of each entry to add.
    :param removed: entries the same request takes away (an update replaces them).
    """
    limit = book.metadata_limit
    if limit is None:
        return None
    used = usage(book)
    for meta in removed:
        used[None] -= size(meta)
        if meta.sheet_id is not None and meta.location_type != "SPREADSHEET":
            used[meta.sheet_id] -= size(meta)
    for sheet_id, chars in added:
        used[None] += chars
        if sheet_id is not None:
            used[sheet_id] = used.get(sheet_id, 0) + chars
    for sheet_id, chars in sorted(used.items(), key=lambda kv: kv[0] is None):
        if chars > limit:
            where = "spreadsheet" if sheet_id is None else f"sheet with id {sheet_id}"
            return (
                f"Developer metadata size limit exceeded: the {where} would hold {chars} characters "
                f"of developer metadata, more than the {limit} allowed. Delete developer metadata "
                "that is no longer needed."
            )
    return None
