"""A1 range parsing and formatting of the Sheets emulator, as the Sheets API accepts them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.testing.sheets_emulator.a1 import (
    A1Error,
    A1Range,
    column_index,
    column_letters,
    format_a1,
    parse_a1,
    quote_title,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A1", A1Range(None, 0, 1, 0, 1)),
        ("Sheet1!B2", A1Range("Sheet1", 1, 2, 1, 2)),
        ("Sheet1!A1:C3", A1Range("Sheet1", 0, 3, 0, 3)),
        ("Queue!A:C", A1Range("Queue", 0, None, 0, 3)),
        ("Queue!A2:C", A1Range("Queue", 1, None, 0, 3)),
        ("Queue!2:5", A1Range("Queue", 1, 5, 0, None)),
        ("Queue", A1Range("Queue")),
        ("'My Sheet'!A1:B2", A1Range("My Sheet", 0, 2, 0, 2)),
        ("'It''s'!A1", A1Range("It's", 0, 1, 0, 1)),
        ("'My Sheet'", A1Range("My Sheet")),
        ("'A!B'!C3", A1Range("A!B", 2, 3, 2, 3)),
        ("a1:b2", A1Range(None, 0, 2, 0, 2)),
        ("C3:A1", A1Range(None, 0, 3, 0, 3)),
        ("Sheet1!AA10:AB11", A1Range("Sheet1", 9, 11, 26, 28)),
        ("B:B", A1Range(None, 0, None, 1, 2)),
        # a cell to a row runs to the right edge; Google's A1 guide lists 1:2 and A5:A beside A:A
        ("Queue!A1:1", A1Range("Queue", 0, 1, 0, None)),
        ("B3:2", A1Range(None, 1, 3, 1, None)),
        ("Sheet1!1:2", A1Range("Sheet1", 0, 2, 0, None)),
        ("Sheet1!A5:A", A1Range("Sheet1", 4, None, 0, 1)),
        ("'My Sheet'!C2:5", A1Range("My Sheet", 1, 5, 2, None)),
    ],
)
def test_it_parses_the_forms_google_accepts(text: str, expected: A1Range) -> None:
    assert parse_a1(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Sheet1!",
        "Sheet1!A0",
        "Sheet1!A1:",
        "Sheet1!:B2",
        "A:C5",
        "1:C",
        "1:C3",
        "A1:0",
        "'unterminated!A1",
        "'x'A1",
        "A1:B2:C3",
    ],
)
def test_it_rejects_what_is_not_a_range(text: str) -> None:
    with pytest.raises(A1Error):
        parse_a1(text)


def test_it_converts_column_names_both_ways() -> None:
    assert [column_index(c) for c in ("A", "Z", "AA", "AZ", "BA", "ZZ", "AAA")] == [
        0,
        25,
        26,
        51,
        52,
        701,
        702,
    ]
    assert [column_letters(i) for i in (0, 25, 26, 51, 52, 701, 702)] == [
        "A",
        "Z",
        "AA",
        "AZ",
        "BA",
        "ZZ",
        "AAA",
    ]


@given(st.integers(min_value=0, max_value=18277))
def test_column_names_round_trip(index: int) -> None:
    assert column_index(column_letters(index)) == index


def test_it_quotes_titles_only_when_google_does() -> None:
    assert quote_title("Sheet1") == "Sheet1"
    assert quote_title("My Sheet") == "'My Sheet'"
    assert quote_title("It's") == "'It''s'"
    assert quote_title("A1") == "'A1'"  # would read as a cell


def test_it_formats_single_cells_and_blocks() -> None:
    assert format_a1("Sheet1", 0, 1, 0, 1) == "Sheet1!A1"
    assert format_a1("My Sheet", 1, 1000, 0, 3) == "'My Sheet'!A2:C1000"


@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1),
    st.integers(0, 5000),
    st.integers(1, 50),
    st.integers(0, 700),
    st.integers(1, 30),
)
def test_formatted_ranges_parse_back(title: str, row: int, rows: int, col: int, cols: int) -> None:
    text = format_a1(title, row, row + rows, col, col + cols)
    parsed = parse_a1(text)
    assert (parsed.start_row, parsed.end_row, parsed.start_col, parsed.end_col) == (
        row,
        row + rows,
        col,
        col + cols,
    )
    assert parsed.sheet == title.strip() or parsed.sheet == title
