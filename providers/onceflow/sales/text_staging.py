"""Staged rows as text, written and read without Arrow: what a small day's tasks exchange.

Importing ``pyarrow`` (and the ``numpy`` it loads whenever it is installed) costs about 0.14 s of
CPU in every daily_sales task process the scheduler did not preload it into, more than the work
of a day of a few thousand orders (issue 27). So a day of at most :func:`text_rows_limit` rows is
staged as text (:mod:`onceflow.sales.staging` picks the format per file) and a larger one as
parquet, which is faster per row.

A file is one JSON header line (``{"format", "columns", "rows", "facts"}``: the facts a parquet
file keeps in its metadata, and the row count, which a reader checks so a cut file is refused),
then one line per row in PostgreSQL's COPY **text** format: fields joined by tabs, ``\\N`` for
NULL, and backslash, tab, newline and carriage return escaped inside text. Rows files are thus
the COPY the PostgreSQL load sends. Text is stored as the bytes the shop returned (``str`` with
``surrogateescape``), so a byte that is not UTF-8 reaches cleaning unchanged, as it does through
parquet's binary columns; a NUL is stored as it is.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from typing import TYPE_CHECKING, Any

from onceflow.sales.schema import ORDER_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

FORMAT = "onceflow-staged-text-1"
#: rows at most for a day staged as text when ``ONCEFLOW_SALES_TEXT_ROWS`` is not set.
DEFAULT_TEXT_ROWS = 10_000
TEXT_ROWS_ENV = "ONCEFLOW_SALES_TEXT_ROWS"
NULL = "\\N"

#: a column's kind: how its values are written and read back.
INT, TEXT, TIMESTAMP, DATE = "int", "text", "timestamp", "date"

#: how each staged file's columns are written: extract (``orders``), rows, rejects.
EXTRACT_KINDS = tuple(
    INT if c == "row_id" else TIMESTAMP if c.endswith("_utc") else TEXT for c in ORDER_COLUMNS
)
SALES_KINDS = (DATE, TEXT, TEXT, TEXT, INT, INT, INT, INT, TIMESTAMP)
REJECT_KINDS = (INT, TEXT, TEXT, TEXT)

_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


class StagedTextError(ValueError):
    """A staged text file is not one this code wrote whole (cut, edited, or another format)."""


def text_rows_limit() -> int:
    """The most rows a day staged as text holds: ``$ONCEFLOW_SALES_TEXT_ROWS`` (0: always
    parquet), else :data:`DEFAULT_TEXT_ROWS`. Read at each call, so a task honours its environment.

    :raises ValueError: the variable is not a whole number of rows.
    """
    configured = os.environ.get(TEXT_ROWS_ENV, "").strip()
    if not configured:
        return DEFAULT_TEXT_ROWS
    try:
        limit = int(configured)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ValueError(
            f"{TEXT_ROWS_ENV} must be a whole number of rows (0: always parquet), got {configured!r}"
        )
    return limit


def _field(kind: str) -> Callable[[Any], str]:
    if kind == TEXT:
        return lambda v: NULL if v is None else v.translate(_ESCAPE)
    if kind == TIMESTAMP:
        return lambda v: NULL if v is None else v.isoformat(sep=" ", timespec="microseconds")
    if kind == DATE:
        return lambda v: NULL if v is None else v.isoformat()
    return lambda v: NULL if v is None else str(int(v))


def copy_lines(rows: Sequence[Sequence[Any]], kinds: Sequence[str]) -> str:
    """``rows`` as COPY text lines, each ending with a newline (values as :func:`check_values` allows)."""
    if not rows:
        return ""
    formats = [_field(k) for k in kinds]
    columns = [list(map(f, column)) for f, column in zip(formats, zip(*rows, strict=True), strict=True)]
    return "".join(line + "\n" for line in map("\t".join, zip(*columns, strict=True)))


def encode(
    rows: Sequence[Sequence[Any]], columns: Sequence[str], kinds: Sequence[str], facts: dict[str, Any]
) -> bytes:
    """A whole staged text file of ``rows`` (fields in ``columns`` order, typed by ``kinds``)."""
    header = json.dumps(
        {"format": FORMAT, "columns": list(columns), "rows": len(rows), "facts": facts}, sort_keys=True
    )
    return (header + "\n" + copy_lines(rows, kinds)).encode("utf-8", "surrogateescape")


def _unescape(value: str) -> str:
    return _ESCAPED.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(1)), value)


#: how a non-text column's field is read back (text is unescaped only where it holds a backslash).
_PARSERS: dict[str, Callable[[str], Any]] = {
    INT: int,
    TIMESTAMP: dt.datetime.fromisoformat,
    DATE: dt.date.fromisoformat,
}


def _column(values: Iterable[str], kind: str) -> list[Any]:
    if kind == TEXT:  # most text holds no backslash: only those are unescaped
        return [None if v == NULL else _unescape(v) if "\\" in v else v for v in values]
    parse = _PARSERS[kind]
    return [None if v == NULL else parse(v) for v in values]


def header(data: bytes, name: str) -> dict[str, Any]:
    """The header of a staged text file (its first line), checked to be one.

    :param name: the file, for the error.
    :raises StagedTextError: the first line is not a staged text header.
    """
    first = data.split(b"\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise StagedTextError(
            f"{name} is not a staged text file of this version ({FORMAT}); re-run the task that wrote it"
        )
    return head


def decode(
    data: bytes, name: str, columns: Sequence[str], kinds: Sequence[str]
) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The facts and the rows of a file :func:`encode` wrote, each row a tuple in ``columns`` order.

    :param name: the file, for errors.
    :raises StagedTextError: the file is cut short, holds other columns, or a line does not parse.
    """
    head = header(data, name)
    if head.get("columns") != list(columns):
        raise StagedTextError(f"{name} holds columns {head.get('columns')}, expected {list(columns)}")
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")[1:]
    if not lines or lines[-1] != "":
        raise StagedTextError(f"{name} does not end with a newline: the file was cut short")
    lines.pop()
    if type(head.get("rows")) is not int or len(lines) != head["rows"]:
        raise StagedTextError(
            f"{name} holds {len(lines)} rows, its header says {head.get('rows')}: the file was cut short"
        )
    if not lines:
        return head["facts"], []
    fields = [line.split("\t") for line in lines]
    width = len(columns)
    bad = next((i for i, f in enumerate(fields) if len(f) != width), None)
    if bad is not None:
        raise StagedTextError(f"{name} line {bad + 2} has {len(fields[bad])} fields, expected {width}")
    try:
        values = [
            _column(column, kind) for column, kind in zip(zip(*fields, strict=True), kinds, strict=True)
        ]
    except ValueError as exc:
        raise StagedTextError(f"{name}: a value does not parse ({exc})") from exc
    return head["facts"], list(zip(*values, strict=True))
