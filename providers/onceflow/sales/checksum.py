"""Deterministic, order-independent checksums of partition rows.

Each row becomes one canonical text line (typed formatting, no locale, no float), each line is
hashed, the line digests are sorted and hashed together. Row order does not matter, duplicates do
(two equal rows differ from one), and the same rows always give the same hex digest, whether they
come from a DataFrame or Arrow batches before the load or from the warehouse afterwards.

:func:`rows_checksum` is the definition (one Python value at a time); :class:`RowDigests` builds
the same digest column-wise from pandas frames or Arrow record batches as rows stream, keeping 32
bytes a row (spilled to sorted runs in a temporary file past :data:`SPILL_ROWS`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from onceflow.sales import arrow_values

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

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


#: canonical text escapes of text values, in order (as :func:`canonical_value` applies them).
CANONICAL_ESCAPES = (("\\", "\\\\"), ("\x1f", "\\x1f"), ("\n", "\\n"))
#: digests kept in memory before they are sorted and spilled as a run (32 bytes each).
SPILL_ROWS = 1_000_000
#: digests of rows added as Python values kept as ``bytes`` before they join the numpy runs.
_PLAIN_ROWS = 100_000
#: digests read from each run at a time while runs are merged.
_MERGE_ROWS = 65_536


def arrow_text(column: Any) -> Any:
    """An Arrow column as :func:`canonical_value` text before escaping, nulls kept; None for a type
    handled only value by value (the caller falls back to pandas)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.cast(pa.string())
    if pa.types.is_integer(kind) or pa.types.is_date32(kind):
        return column.cast(pa.string())  # str() of an int; a date's ISO form
    if pa.types.is_timestamp(kind) and kind.tz is None and kind.unit == "us":
        # "YYYY-MM-DD HH:MM:SS.ffffff", isoformat(sep=" ", timespec="microseconds") (tested for
        # years 1 to 9999); Arrow's strftime gives the same 40x slower.
        return column.cast(pa.string())
    if pa.types.is_boolean(kind):
        return pc.if_else(column, arrow_values.text("t"), arrow_values.text("f"))
    return None


def arrow_texts(batch: Any, columns: Sequence[str]) -> list[tuple[Any, bool]] | None:
    """``(text, is_text)`` for each column of ``batch`` (:func:`arrow_text`; ``is_text``: values
    that need escaping), or None if a column's type is not handled."""
    import pyarrow as pa

    texts = []
    for name in columns:
        column = batch.column(name)
        text = arrow_text(column)
        if text is None:
            return None
        texts.append((text, pa.types.is_string(column.type) or pa.types.is_large_string(column.type)))
    return texts


def join_lines(texts: Sequence[tuple[Any, bool]], separator: str, escapes: Sequence[tuple[str, str]]) -> Any:
    """One line per row from :func:`arrow_texts`: text values escaped with ``escapes`` (in order),
    NULL as ``\\N``, the columns joined by ``separator``."""
    import pyarrow.compute as pc

    parts = []
    for text, is_text in texts:
        if is_text:
            for plain, escaped in escapes:
                if pc.any(pc.match_substring(text, plain)).as_py():
                    text = pc.replace_substring(text, plain, escaped)
        parts.append(pc.fill_null(text, arrow_values.text("\\N")))
    return pc.binary_join_element_wise(*parts, arrow_values.text(separator))


def arrow_lines(
    batch: Any, columns: Sequence[str], separator: str, escapes: Sequence[tuple[str, str]]
) -> Any:
    """:func:`join_lines` of :func:`arrow_texts` (None if a column's type is not handled)."""
    texts = arrow_texts(batch, columns)
    return None if texts is None else join_lines(texts, separator, escapes)


def line_digests(lines: Any) -> bytes:
    """SHA-256 of each value of an Arrow string array, concatenated (32 bytes a line)."""
    import numpy as np

    _validity, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1].tolist()
    values = data.to_pybytes() if data is not None else b""
    sha = hashlib.sha256
    return b"".join([sha(values[a:b]).digest() for a, b in itertools.pairwise(bounds)])


class RowDigests:
    """:func:`rows_checksum` built batch by batch as rows stream: 32 bytes a row.

    The digests live in numpy arrays rather than a list of ``bytes`` objects (about 100 bytes
    each), read as four big-endian 64-bit words, so sorting the rows of words numerically is
    sorting the digests by their bytes, and the result is exactly :func:`rows_checksum`'s. Past
    :data:`SPILL_ROWS` digests the ones in memory are sorted and written to a temporary file as a
    run; :meth:`hexdigest` merges the runs, so memory stays bounded whatever the row count.
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = columns
        self._plain: list[bytes] = []  # digests of rows added as Python values (add_rows)
        self._parts: list[Any] = []
        self._pending = 0
        self._runs: list[tuple[int, int]] = []  # (first digest, count) of each run in the file
        self._file: Any = None
        self.rows = 0

    def add(self, df: pd.DataFrame) -> None:
        """Add the rows of ``df[columns]`` (a pandas frame)."""
        if df.empty:
            return
        lines = _canonical_column(df[self.columns[0]])
        for name in self.columns[1:]:
            lines = lines + "\x1f" + _canonical_column(df[name])
        self._add_packed(b"".join(hashlib.sha256(line.encode()).digest() for line in lines))

    def add_arrow(self, batch: Any) -> None:
        """Add the rows of an Arrow record batch or table (its ``columns``), formatted column-wise
        by Arrow; a column type Arrow does not format here goes through pandas instead."""
        if not batch.num_rows:
            return
        lines = arrow_lines(batch, self.columns, "\x1f", CANONICAL_ESCAPES)
        if lines is None:
            self.add(batch.to_pandas())
            return
        self.add_lines(lines)

    def add_lines(self, lines: Any) -> None:
        """Add rows given as their canonical lines (:func:`arrow_lines` with ``"\\x1f"`` and
        :data:`CANONICAL_ESCAPES`), an Arrow string array."""
        for chunk in lines.chunks if hasattr(lines, "chunks") else [lines]:
            if len(chunk):
                self._add_packed(line_digests(chunk))

    def add_rows(self, rows: Sequence[Sequence[object]]) -> None:
        """Add rows of plain Python values (in ``columns`` order), each digest of its
        :func:`canonical_line`: a load that adds only these, and few, never imports numpy."""
        sha = hashlib.sha256
        self._plain += [sha(canonical_line(row).encode()).digest() for row in rows]
        self.rows += len(rows)
        if len(self._plain) >= _PLAIN_ROWS:
            self._pack_plain()

    def _pack_plain(self) -> None:
        """Move the digests of :meth:`add_rows` into the numpy runs (counted there, not again)."""
        if self._plain:
            count, packed, self._plain = len(self._plain), b"".join(self._plain), []
            self._add_packed(packed)
            self.rows -= count

    def add_digests(self, packed: bytes) -> None:
        """Add rows given as the SHA-256 digests of their canonical lines, concatenated."""
        if packed:
            self._add_packed(packed)

    def _add_packed(self, packed: bytes) -> None:
        import numpy as np

        # One 32-byte value per digest, sorted as a run here (where the rows stream, overlapping
        # the COPY): the final sort then merges runs, which a stable sort does fast.
        digests = _sort_digests(np.frombuffer(packed, dtype="V32"))
        self._parts.append(digests)
        self._pending += len(digests)
        self.rows += len(digests)
        if self._pending >= SPILL_ROWS:
            self._spill()

    def _sorted_pending(self) -> Any:
        import numpy as np

        digests = np.concatenate(self._parts) if self._parts else np.empty(0, dtype="V32")
        self._parts, self._pending = [], 0
        return _sort_digests(digests)

    def _spill(self) -> None:
        import tempfile

        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="onceflow-digests-")  # noqa: SIM115 (closed by close())
        digests = self._sorted_pending()
        first = sum(count for _start, count in self._runs)
        self._file.seek(first * 32)
        self._file.write(digests.tobytes())
        self._runs.append((first, len(digests)))

    def hexdigest(self) -> str:
        """The checksum of every row added so far, independent of their order (as ``rows_checksum``)."""
        outer = hashlib.sha256()
        if not self._parts and not self._runs:  # only add_rows' digests: sorted as bytes, in Python
            self._plain.sort()
            outer.update(b"".join(self._plain))
            return outer.hexdigest()
        self._pack_plain()
        if not self._runs:
            digests = self._sorted_pending()
            self._parts, self._pending = [digests], len(digests)  # sorted already: a second call is cheap
            outer.update(digests.view("u1"))
            return outer.hexdigest()
        if self._pending:
            self._spill()
        for digests in _merge_runs(self._file, self._runs):
            outer.update(digests.view("u1"))
        return outer.hexdigest()

    def close(self) -> None:
        """Delete the spilled runs, if any."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _words(digests: Any) -> Any:
    """32-byte digests (numpy ``V32``) as rows of four big-endian 64-bit words, no copy."""
    return digests.view(">u8").reshape(-1, 4)


def _sort_digests(digests: Any) -> Any:
    """32-byte digests sorted by their bytes: by the first 8 as a number (stable, so runs already
    sorted merge fast), all 32 word by word when two first words agree (equal rows, in practice)."""
    import numpy as np

    words = _words(digests)
    key = words[:, 0].astype(np.uint64)
    order = np.argsort(key, kind="stable")
    first = key[order]
    if len(first) > 1 and (first[1:] == first[:-1]).any():
        order = np.lexsort((words[:, 3], words[:, 2], words[:, 1], words[:, 0]))
    return digests[order]


def _not_above(words: Any, limit: Any) -> Any:
    """Which rows of ``words`` sort at or before the row ``limit`` (word by word)."""
    import numpy as np

    result = np.zeros(len(words), dtype=bool)
    equal = np.ones(len(words), dtype=bool)
    for i in range(4):
        result |= equal & (words[:, i] < limit[i])
        equal &= words[:, i] == limit[i]
    return result | equal


def _merge_runs(file: Any, runs: Sequence[tuple[int, int]]) -> Iterator[Any]:
    """The digests of sorted ``runs`` of ``file`` in one sorted stream, a few runs' chunks at a time."""
    import numpy as np

    positions = [start for start, _count in runs]
    ends = [start + count for start, count in runs]

    def read(i: int) -> Any:
        count = min(_MERGE_ROWS, ends[i] - positions[i])
        file.seek(positions[i] * 32)
        digests = np.frombuffer(file.read(count * 32), dtype="V32")
        positions[i] += count
        return digests

    heads = [read(i) for i in range(len(runs))]
    while True:
        live = [i for i, head in enumerate(heads) if len(head)]
        if not live:
            return
        # Every digest up to the smallest last digest of the heads: no later chunk holds a smaller one.
        limit = min((_words(heads[i])[-1] for i in live), key=lambda w: tuple(w.tolist()))
        taken = []
        for i in live:
            cut = int(_not_above(_words(heads[i]), limit).sum())  # a sorted head: a prefix
            taken.append(heads[i][:cut])
            heads[i] = heads[i][cut:]
            if not len(heads[i]) and positions[i] < ends[i]:
                heads[i] = read(i)
        merged = np.concatenate(taken)
        if not len(merged):  # cannot happen with sorted runs: the head ending at the limit moves
            raise RuntimeError("merging checksum runs made no progress: a run is not sorted")
        yield _sort_digests(merged)


def frame_checksum(df: pd.DataFrame, columns: Sequence[str]) -> str:
    """:func:`rows_checksum` of ``df[columns]``, built column-wise (fast for large partitions)."""
    digests = RowDigests(columns)
    try:
        digests.add(df)
        return digests.hexdigest()
    finally:
        digests.close()
