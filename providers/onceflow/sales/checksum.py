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
from typing import TYPE_CHECKING, Any

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


class RowDigests:
    """:func:`rows_checksum` built batch by batch as rows stream: 32 bytes a row, sorted in place.

    The digests live in numpy arrays rather than a list of ``bytes`` objects (about 100 bytes
    each), and are sorted as rows of four big-endian 64-bit words, which is their byte order, so
    the result is exactly :func:`rows_checksum`'s.
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = columns
        self._parts: list[Any] = []
        self.rows = 0

    def add(self, df: pd.DataFrame) -> None:
        """Add the rows of ``df[columns]``."""
        import numpy as np

        if df.empty:
            return
        lines = _canonical_column(df[self.columns[0]])
        for name in self.columns[1:]:
            lines = lines + "\x1f" + _canonical_column(df[name])
        packed = b"".join(hashlib.sha256(line.encode()).digest() for line in lines)
        self._parts.append(np.frombuffer(packed, dtype=np.uint8))
        self.rows += len(df)

    def hexdigest(self) -> str:
        """The checksum of every row added so far, independent of their order (as ``rows_checksum``)."""
        import numpy as np

        if not self._parts:
            return rows_checksum([])
        words = np.concatenate(self._parts).view(">u8").view([(f"w{i}", ">u8") for i in range(4)])
        self._parts = [words]
        words.sort(kind="stable")  # in place: field by field, i.e. byte order
        return hashlib.sha256(words.tobytes()).hexdigest()


def frame_checksum(df: pd.DataFrame, columns: Sequence[str]) -> str:
    """:func:`rows_checksum` of ``df[columns]``, built column-wise (fast for large partitions)."""
    digests = RowDigests(columns)
    digests.add(df)
    return digests.hexdigest()
