"""A1 notation: parse ``'My Sheet'!A2:C`` into zero-based half-open bounds, and format them back.

Bounds follow the Sheets ``GridRange`` convention: ``start`` inclusive, ``end`` exclusive, ``None``
meaning "to the edge of the grid". Nothing here knows about a sheet's size; callers clip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CELL = re.compile(r"^([A-Za-z]*)([0-9]*)$")
# A title needs no quotes only when it cannot be mistaken for a cell or contain a separator.
_PLAIN_TITLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOKS_LIKE_CELL = re.compile(r"^[A-Za-z]{1,3}[0-9]+$")
_MAX_COLUMNS = 18278  # ZZZ, the widest a Google sheet can be addressed
_MAX_ROWS = 10_000_000


class A1Error(ValueError):
    """The text is not a range the Sheets API would accept."""


@dataclass(frozen=True)
class A1Range:
    """A parsed A1 range; ``sheet`` is ``None`` when the text named no sheet (the first sheet)."""

    sheet: str | None
    start_row: int = 0
    end_row: int | None = None
    start_col: int = 0
    end_col: int | None = None


def column_index(letters: str) -> int:
    """Return the zero-based index of a column name: ``A`` -> 0, ``AA`` -> 26.

    :param letters: one or more ASCII letters, any case.
    """
    index = 0
    for char in letters.upper():
        if not "A" <= char <= "Z":
            raise A1Error(f"not a column name: {letters!r}")
        index = index * 26 + (ord(char) - ord("A") + 1)
    return index - 1


def column_letters(index: int) -> str:
    """Return the column name of a zero-based column index: 0 -> ``A``, 26 -> ``AA``.

    :param index: zero-based column index.
    """
    if index < 0:
        raise A1Error(f"negative column index {index}")
    letters = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        letters = chr(ord("A") + rem) + letters
    return letters


def quote_title(title: str) -> str:
    """Return a sheet title as Google writes it inside a range: quoted when it needs to be.

    :param title: the sheet title.
    """
    if _PLAIN_TITLE.match(title) and not _LOOKS_LIKE_CELL.match(title):
        return title
    return "'" + title.replace("'", "''") + "'"


def _split_sheet(text: str) -> tuple[str | None, str]:
    """Split ``'It''s'!A1`` into (``It's``, ``A1``); a bare title gives (title, "")."""
    if text.startswith("'"):
        i = 1
        title_chars: list[str] = []
        while i < len(text):
            if text[i] == "'":
                if i + 1 < len(text) and text[i + 1] == "'":
                    title_chars.append("'")
                    i += 2
                    continue
                break
            title_chars.append(text[i])
            i += 1
        else:
            raise A1Error(f"unterminated quoted sheet name in {text!r}")
        rest = text[i + 1 :]
        if rest == "":
            return "".join(title_chars), ""
        if not rest.startswith("!"):
            raise A1Error(f"expected '!' after the sheet name in {text!r}")
        return "".join(title_chars), rest[1:]
    if "!" in text:
        title, _, cells = text.rpartition("!")
        if cells == "":
            raise A1Error(f"Unable to parse range: {text}")
        return title, cells
    return None, text


def _parse_endpoint(part: str, text: str) -> tuple[str, str]:
    match = _CELL.match(part)
    if not match or part == "":
        raise A1Error(f"Unable to parse range: {text}")
    letters, digits = match.groups()
    if digits and int(digits) == 0:
        raise A1Error(f"Unable to parse range: {text}")
    return letters, digits


def parse_a1(text: str) -> A1Range:
    """Parse an A1 range as the Sheets API accepts it.

    Accepted forms: ``Sheet``, ``Sheet!A1``, ``A1:C3``, ``A:C`` (whole columns), ``2:5`` (whole rows),
    ``A2:C`` (a cell to a column: open towards the bottom), ``A1:1`` (a cell to a row: open towards
    the right), and sheet names quoted with ``'`` (``''`` escapes a quote). A bare word that is not
    a cell reference is a sheet title.

    :param text: the range, already percent-decoded.
    :raises A1Error: when the text cannot be a range.
    """
    if text is None or text.strip() == "":
        raise A1Error("Unable to parse range: ")
    sheet, cells = _split_sheet(text.strip())
    if sheet is not None and sheet == "":
        raise A1Error(f"Unable to parse range: {text}")
    if sheet is None and ":" not in cells and not _LOOKS_LIKE_CELL.match(cells):
        # "Queue" is a sheet title; "A1" or "A:B" is a range on the first sheet.
        return A1Range(sheet=cells)
    if cells == "":
        return A1Range(sheet=sheet)

    start_text, sep, end_text = cells.partition(":")
    c0, r0 = _parse_endpoint(start_text, text)
    if not sep:
        if not (c0 and r0):
            raise A1Error(f"Unable to parse range: {text}")
        col, row = column_index(c0), int(r0) - 1
        return _checked(A1Range(sheet, row, row + 1, col, col + 1), text)
    c1, r1 = _parse_endpoint(end_text, text)
    kinds = (_kind(c0, r0), _kind(c1, r1))
    # Cell to cell, cell to column (open at the bottom), cell to row (open at the right), column to
    # column, row to row. A column or a row first, then a cell ("A:C5", "1:C3"), is refused.
    if kinds not in {("cell", "cell"), ("cell", "col"), ("cell", "row"), ("col", "col"), ("row", "row")}:
        raise A1Error(f"Unable to parse range: {text}")
    start_col = column_index(c0) if c0 else 0
    end_col = column_index(c1) + 1 if c1 else None
    start_row = int(r0) - 1 if r0 else 0
    end_row = int(r1) if r1 else None
    # Google accepts reversed corners ("C3:A1") and normalises them.
    if end_col is not None and end_col <= start_col:
        start_col, end_col = end_col - 1, start_col + 1
    if end_row is not None and end_row <= start_row:
        start_row, end_row = end_row - 1, start_row + 1
    return _checked(A1Range(sheet, start_row, end_row, start_col, end_col), text)


def _kind(letters: str, digits: str) -> str:
    if letters and digits:
        return "cell"
    return "col" if letters else "row"


def _checked(rng: A1Range, text: str) -> A1Range:
    if rng.start_col >= _MAX_COLUMNS or (rng.end_col or 0) > _MAX_COLUMNS:
        raise A1Error(f"Unable to parse range: {text}")
    if rng.start_row >= _MAX_ROWS or (rng.end_row or 0) > _MAX_ROWS:
        raise A1Error(f"Unable to parse range: {text}")
    return rng


def format_a1(title: str, start_row: int, end_row: int, start_col: int, end_col: int) -> str:
    """Format closed-on-the-grid bounds as Google echoes them: ``Sheet1!A1:C3``, or ``Sheet1!B2``.

    :param title: sheet title (quoted here when needed).
    :param start_row: zero-based first row.
    :param end_row: exclusive end row.
    :param start_col: zero-based first column.
    :param end_col: exclusive end column.
    """
    first = f"{column_letters(start_col)}{start_row + 1}"
    last = f"{column_letters(end_col - 1)}{end_row}"
    cells = first if first == last else f"{first}:{last}"
    return f"{quote_title(title)}!{cells}"
