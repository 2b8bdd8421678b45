"""A1 notation the queue's requests need: a whole tab by title, a column letter."""

from __future__ import annotations


def a1_sheet(title: str) -> str:
    """A1 notation for a whole tab, quoted so any title works."""
    return "'" + title.replace("'", "''") + "'"


def column_letter(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA."""
    letters = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        letters = chr(65 + rem) + letters
    return letters
