"""values.append's table detection in the Sheets emulator (``tables.find_table``), below the API."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow.testing.sheets_emulator.model import Bounds, Sheet
from onceflow.testing.sheets_emulator.tables import find_table


def _sheet(rows: list[list[Any]]) -> Sheet:
    return Sheet(0, "Q", rows=[[None if v == "" else v for v in row] for row in rows])


def _table(sheet: Sheet, r0: int, r1: int, c0: int, c1: int) -> tuple[int, int, int, int] | None:
    found = find_table(Bounds(sheet, r0, r1, c0, c1))
    return None if found is None else (found.start_row, found.end_row, found.start_col, found.end_col)


def test_cells_side_by_side_or_stacked_join_but_diagonal_ones_do_not() -> None:
    sheet = _sheet([["a", ""], ["", "b"]])

    assert _table(sheet, 0, 1000, 0, 26) == (1, 2, 1, 2)  # the last filled cell's table: b alone
    assert _table(sheet, 0, 1, 0, 1) == (0, 1, 0, 1)


def test_a_table_is_the_rectangle_around_a_winding_group() -> None:
    # a U: the two arms meet through the bottom row, so the hollow middle is inside the table
    sheet = _sheet([["a", "", "c"], ["a", "", "c"], ["a", "a", "c"], [], ["far"]])

    assert _table(sheet, 0, 1, 2, 3) == (0, 3, 0, 3)
    assert _table(sheet, 0, 1000, 0, 26) == (4, 5, 0, 1)


@pytest.mark.parametrize(("r0", "c0"), [(3, 0), (0, 1)])
def test_a_range_of_empty_cells_has_no_table(r0: int, c0: int) -> None:
    sheet = _sheet([["a", "", "c"], ["a", "", "c"], ["a", "a", "c"]])

    assert _table(sheet, r0, r0 + 2, c0, c0 + 1) is None
