"""Deterministic, order-independent checksums of partition rows.

Each row becomes one canonical text line (typed formatting, no locale, no float), each line is
hashed, the line digests are sorted and hashed together. Row order does not matter, duplicates do
(two equal rows differ from one), and the same rows always give the same hex digest, whether they
come from a DataFrame before the load or from the warehouse afterwards.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import pandas as pd


def canonical_value(value: object) -> str:
    """Text form of one value, identical for equal values across drivers and pandas."""
    if value is None:
        return "\\N"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | Decimal):
        return str(value)
    if hasattr(value, "item"):  # numpy scalars
        return canonical_value(value.item())
    text = str(value)
    return text.replace("\\", "\\\\").replace("\x1f", "\\x1f").replace("\n", "\\n")


def canonical_line(row: Sequence[object]) -> str:
    """One row as a unit-separator-joined line of canonical values."""
    return "\x1f".join(canonical_value(v) for v in row)


def rows_checksum(rows: Iterable[Sequence[object]]) -> str:
    """SHA-256 hex digest of a multiset of rows (order-independent)."""
    digests = sorted(hashlib.sha256(canonical_line(r).encode()).digest() for r in rows)
    outer = hashlib.sha256()
    for digest in digests:
        outer.update(digest)
    return outer.hexdigest()


def _canonical_column(series: pd.Series) -> pd.Series:
    """Vectorised :func:`canonical_value` of one column (same text for the same values)."""
    import pandas as pd

    missing = series.isna()
    if pd.api.types.is_datetime64_any_dtype(series):
        text = series.dt.strftime("%Y-%m-%d %H:%M:%S.%f")
    elif pd.api.types.is_integer_dtype(series):
        text = series.astype("int64").astype(str)
    else:
        values = series.astype(object)
        if values.map(lambda v: isinstance(v, dt.date) and not isinstance(v, dt.datetime)).all():
            text = values.map(lambda v: v.isoformat())
        else:
            text = (
                values.astype(str)
                .str.replace("\\", "\\\\", regex=False)
                .str.replace("\x1f", "\\x1f", regex=False)
                .str.replace("\n", "\\n", regex=False)
            )
    return text.where(~missing, "\\N").astype(object)


def frame_checksum(df: pd.DataFrame, columns: Sequence[str]) -> str:
    """:func:`rows_checksum` of ``df[columns]``, built column-wise (fast for large partitions)."""
    if df.empty:
        return rows_checksum([])
    lines = _canonical_column(df[columns[0]])
    for name in columns[1:]:
        lines = lines + "\x1f" + _canonical_column(df[name])
    digests = sorted(hashlib.sha256(line.encode()).digest() for line in lines)
    outer = hashlib.sha256()
    for digest in digests:
        outer.update(digest)
    return outer.hexdigest()
