"""Cell values: how input is stored (RAW vs USER_ENTERED) and how stored values are rendered.

A stored cell is ``None`` (empty), ``str``, ``int``, ``float``, ``bool`` or :class:`Formula`.
Formulas are kept as text and never evaluated; every render option returns their text.
"""

from __future__ import annotations

import math
import re
from typing import Any

from onceflow.testing.sheets_emulator.errors import invalid_argument

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")

INPUT_OPTIONS = ("RAW", "USER_ENTERED")
RENDER_OPTIONS = ("FORMATTED_VALUE", "UNFORMATTED_VALUE", "FORMULA")


class Formula(str):
    """A cell entered as ``=...`` with USER_ENTERED: stored as its text, not evaluated."""

    __slots__ = ()


# Formula is a str, so it needs no place of its own in the union.
Cell = str | int | float | bool | None


def _number(value: float) -> int | float:
    """Sheets keeps every number as a double; integral ones serialise without a fraction."""
    if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return int(value)
    return value


def parse_input(value: Any, option: str) -> Cell | type[Skip]:
    """Turn one incoming JSON value into a stored cell.

    ``null`` means "leave this cell alone" (the API skips it); ``""`` empties the cell.

    :param value: a JSON scalar from the request body.
    :param option: ``RAW`` or ``USER_ENTERED``.
    """
    if value is None:
        return Skip
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid_argument(f"Invalid value: {value}")
        return _number(value)
    if not isinstance(value, str):
        raise invalid_argument(f"Invalid values[0][0]: {type(value).__name__}_value")
    if value == "":
        return None
    if option == "RAW":
        return value
    if value.startswith("'"):
        # A leading apostrophe forces text in the Sheets UI and API; the apostrophe is not stored.
        return value[1:] or None
    if value.startswith("=") and len(value) > 1:
        return Formula(value)
    upper = value.strip().upper()
    if upper in ("TRUE", "FALSE"):
        return upper == "TRUE"
    stripped = value.strip()
    if _NUMBER.match(stripped):
        return _number(float(stripped))
    return value


class Skip:
    """Marker returned by :func:`parse_input` for ``null``: the write leaves the cell unchanged."""


def formatted(cell: Cell) -> str:
    """Render a cell as FORMATTED_VALUE (what a user sees; formulas show their text).

    :param cell: a stored cell.
    """
    if cell is None:
        return ""
    if isinstance(cell, bool):
        return "TRUE" if cell else "FALSE"
    if isinstance(cell, int):
        return str(cell)
    if isinstance(cell, float):
        return format(cell, ".15g").replace("e+", "E+").replace("e-", "E-")
    return str(cell)


def render(cell: Cell, option: str) -> Any:
    """Render a cell for a response.

    :param cell: a stored cell.
    :param option: FORMATTED_VALUE, UNFORMATTED_VALUE or FORMULA.
    """
    if cell is None:
        return ""
    if option == "FORMATTED_VALUE":
        return formatted(cell)
    if isinstance(cell, Formula):
        return str(cell)
    return cell


def to_json(cell: Cell) -> Any:
    """Encode a cell for the state file, keeping formulas distinct from text starting with ``=``."""
    if isinstance(cell, Formula):
        return {"f": str(cell)}
    return cell


def from_json(value: Any) -> Cell:
    """Decode a cell written by :func:`to_json`."""
    if isinstance(value, dict):
        return Formula(value["f"])
    return value
