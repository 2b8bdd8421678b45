"""``values.append``'s table detection, as Google's values guide describes it.

A table is a group of non-empty cells joined side by side or one above the other (not diagonally),
taken as the rectangle that bounds them; an empty row or column (or an empty cell all around)
separates two tables. The append range picks one: the table holding the range's last filled cell
(bottom row first, then the rightmost cell of that row). A table can reach outside the range: a
range that touches any of its cells selects all of it. A range holding no filled cell selects no
table, and the values are written at the range's first cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.testing.sheets_emulator.model import Bounds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from onceflow.testing.sheets_emulator.model import Sheet


def _runs(cells: Sequence[object]) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of consecutive non-empty cells of one row."""
    runs: list[tuple[int, int]] = []
    start = None
    for c, cell in enumerate(cells):
        if cell is not None and start is None:
            start = c
        elif cell is None and start is not None:
            runs.append((start, c))
            start = None
    if start is not None:
        runs.append((start, len(cells)))
    return runs


def _last_filled(sheet: Sheet, bounds: Bounds) -> tuple[int, int] | None:
    for r in range(min(bounds.end_row, len(sheet.rows)) - 1, bounds.start_row - 1, -1):
        cells = sheet.rows[r]
        for c in range(min(bounds.end_col, len(cells)) - 1, bounds.start_col - 1, -1):
            if cells[c] is not None:
                return r, c
    return None


def find_table(bounds: Bounds) -> Bounds | None:
    """The table ``values.append`` appends to for the range ``bounds``, or ``None``.

    The search walks runs of filled cells row by row (a run joins the runs that share a column
    with it in the row above or below), so its cost is the table's rows, not the sheet's.
    """
    sheet = bounds.sheet
    seed = _last_filled(sheet, bounds)
    if seed is None:
        return None
    runs: dict[int, list[tuple[int, int]]] = {}

    def runs_of(r: int) -> list[tuple[int, int]]:
        if r not in runs:
            runs[r] = _runs(sheet.rows[r]) if 0 <= r < len(sheet.rows) else []
        return runs[r]

    row, col = seed
    first = next(run for run in runs_of(row) if run[0] <= col < run[1])
    seen = {(row, first[0])}
    todo = [(row, first)]
    top, bottom, left, right = row, row + 1, first[0], first[1]
    while todo:
        r, (c0, c1) = todo.pop()
        top, bottom = min(top, r), max(bottom, r + 1)
        left, right = min(left, c0), max(right, c1)
        for near in (r - 1, r + 1):
            for run in runs_of(near):
                if run[0] < c1 and c0 < run[1] and (near, run[0]) not in seen:
                    seen.add((near, run[0]))
                    todo.append((near, run))
    return Bounds(sheet, top, bottom, left, right)
