"""Writing sales rows into the warehouse table: COPY, INSERT and the baselines.

COPY uses PostgreSQL's **text** format, built column-wise (by Arrow for record batches,
:func:`arrow_copy_text`; by pandas for frames, :func:`copy_text`): tab-separated, ``\\N`` for
NULL, and backslash, tab, newline and carriage return escaped inside values. Unlike CSV, text
format has no "unquoted empty field" ambiguity: an empty string is an empty field and only ``\\N``
is NULL (a value that is literally ``\\N`` is written ``\\\\N``). So ``customer_id = ""`` stays
``""`` and the stored rows equal the frame on PostgreSQL and SQLite alike.

:func:`copy_chunks` streams one COPY from chunks of that text that a second thread produces (reads,
formats, checksums) while the driver sends the previous chunk, so the client's work and the
server's overlap.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import itertools
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from onceflow.sales.arrow_values import text
from onceflow.sales.deadlines import translate
from onceflow.sales.schema import SALES_COLUMNS

if TYPE_CHECKING:
    import pandas as pd
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection

LoadMethod = Literal["auto", "copy", "insert", "executemany", "to_sql"]
COPY_NULL = "\\N"


def frame_records(df: pd.DataFrame, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows of ``df`` as tuples of plain Python values (ints, str, date, datetime, None)."""
    import pandas as pd

    cols: list[list[Any]] = []
    for name in columns:
        series = df[name]
        if pd.api.types.is_datetime64_any_dtype(series):
            cols.append([None if pd.isna(v) else v.to_pydatetime() for v in series])
        elif pd.api.types.is_integer_dtype(series):
            cols.append(series.tolist())
        else:
            cols.append(
                [None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v for v in series]
            )
    return list(zip(*cols, strict=True)) if cols else []


def _copy_text_column(series: pd.Series) -> pd.Series:
    import pandas as pd

    missing = series.isna()
    if pd.api.types.is_datetime64_any_dtype(series):
        text = series.dt.strftime("%Y-%m-%d %H:%M:%S.%f")
    elif pd.api.types.is_integer_dtype(series):
        text = series.astype("int64").astype(str)
    else:
        values = series.astype(object)
        present = values[~missing]
        text = values.astype(str)  # str() of a date is its ISO form
        is_date = len(present) > 0 and isinstance(present.iloc[0], dt.date)
        if not is_date and text.str.contains(r"[\\\t\n\r]", regex=True).any():
            text = (
                text.str.replace("\\", "\\\\", regex=False)
                .str.replace("\t", "\\t", regex=False)
                .str.replace("\n", "\\n", regex=False)
                .str.replace("\r", "\\r", regex=False)
            )
    return text.where(~missing, COPY_NULL).astype(object)


def copy_text(rows: pd.DataFrame, columns: Sequence[str] = SALES_COLUMNS) -> io.StringIO:
    """``rows[columns]`` in COPY text format (see the module docstring), one line per row."""
    import pandas as pd

    buf = io.StringIO()
    if rows.empty:
        return buf
    texts = [_copy_text_column(rows[name]) for name in columns]
    lines = texts[0].str.cat(pd.concat(texts[1:], axis=1), sep="\t")
    buf.write("\n".join(lines.tolist()))
    buf.write("\n")
    buf.seek(0)
    return buf


#: COPY text escapes of text values, in order (backslash first).
COPY_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))


def arrow_copy_text(batch: Any, columns: Sequence[str] = SALES_COLUMNS) -> bytes | None:
    """An Arrow record batch's ``columns`` in COPY text format, one line per row, formatted
    column-wise by Arrow; None if a column's type is not handled (:func:`copy_text` then)."""
    from onceflow.sales.checksum import arrow_texts

    texts = arrow_texts(batch, columns)
    return None if texts is None else copy_lines_text(texts)


def copy_lines_text(texts: Sequence[tuple[Any, bool]]) -> bytes:
    """COPY text of :func:`onceflow.sales.checksum.arrow_texts`' columns: one line per row."""
    import pyarrow.compute as pc

    from onceflow.sales.checksum import join_lines

    if not len(texts[0][0]):
        return b""
    lines = pc.binary_join_element_wise(
        join_lines(texts, "\t", COPY_ESCAPES), text("\n"), text("")
    )  # newline-ended
    return _values(lines)[0]


#: a character escaped in COPY text or in the checksum's canonical lines.
_ESCAPED = r"[\\\t\n\r\x1f]"
_TAB_TO_UNIT_SEPARATOR = bytes.maketrans(b"\t", b"\x1f")


def copy_text_and_digests(texts: Sequence[tuple[Any, bool]]) -> tuple[bytes, bytes]:
    """COPY text of :func:`onceflow.sales.checksum.arrow_texts`' columns, and the SHA-256 digest
    of each row's canonical line (:func:`onceflow.sales.checksum.canonical_line`), concatenated.

    When no text value holds a character either format escapes, a row's canonical line is its
    COPY line without the newline, tabs read as ``\\x1f``: one join serves both (the bytes are
    translated, not formatted again). Otherwise the two are joined apart.
    """
    import pyarrow.compute as pc

    from onceflow.sales.checksum import CANONICAL_ESCAPES, join_lines, line_digests

    if not len(texts[0][0]):
        return b"", b""
    if any(
        is_text and pc.any(pc.match_substring_regex(column, _ESCAPED)).as_py() for column, is_text in texts
    ):
        return copy_lines_text(texts), line_digests(join_lines(texts, "\x1f", CANONICAL_ESCAPES))
    parts = [pc.fill_null(column, text("\\N")) for column, _is_text in texts]
    parts[-1] = pc.binary_join_element_wise(parts[-1], text("\n"), text(""))  # each line ends with a newline
    values, bounds = _values(pc.binary_join_element_wise(*parts, text("\t")))
    canonical = values.translate(_TAB_TO_UNIT_SEPARATOR)
    sha = hashlib.sha256
    return values, b"".join([sha(canonical[a : b - 1]).digest() for a, b in itertools.pairwise(bounds)])


def _values(lines: Any) -> tuple[bytes, list[int]]:
    """The bytes of an Arrow string array's values, end to end, and each value's bounds in them."""
    import numpy as np

    _validity, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1]
    first = int(bounds[0])
    return data.to_pybytes()[first : int(bounds[-1])], (bounds - first).tolist()


def copy_statement(quoted_table: str, columns: Sequence[str] = SALES_COLUMNS) -> str:
    """``COPY ... FROM STDIN`` in text format with the NULL marker spelled out."""
    return f"COPY {quoted_table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT text, NULL '\\N')"


def insert_rows(conn: Connection, table: sa.Table, rows: pd.DataFrame, method: LoadMethod) -> None:
    """Insert ``rows`` into ``table`` inside the caller's transaction.

    :param method: ``auto`` (COPY on PostgreSQL, INSERT elsewhere), ``copy``, ``insert``, or the
        baselines the benchmark compares: ``executemany`` (DBAPI) and ``to_sql`` (pandas).
    """
    if rows.empty:
        return
    dialect = conn.dialect.name
    if method == "auto":
        method = "copy" if dialect == "postgresql" else "insert"
    quoted = conn.dialect.identifier_preparer.format_table(table)
    if method == "copy":
        _copy(conn, quoted, rows)
    elif method == "insert":
        records = frame_records(rows, SALES_COLUMNS)
        conn.execute(table.insert(), [dict(zip(SALES_COLUMNS, r, strict=True)) for r in records])
    elif method == "executemany":
        records = frame_records(rows, SALES_COLUMNS)
        placeholders = ", ".join(["%s" if dialect == "postgresql" else "?"] * len(SALES_COLUMNS))
        sql = f"INSERT INTO {quoted} ({', '.join(SALES_COLUMNS)}) VALUES ({placeholders})"
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.executemany(sql, records)
        finally:
            cursor.close()
    elif method == "to_sql":
        rows.loc[:, list(SALES_COLUMNS)].to_sql(
            table.name, conn, schema=table.schema, if_exists="append", index=False, chunksize=10_000
        )
    else:
        raise ValueError(f"unknown load method {method!r}")


def _copy(conn: Connection, quoted_table: str, rows: pd.DataFrame) -> None:
    buf = copy_text(rows)
    copy_chunks(conn, quoted_table, iter(lambda: buf.read(1 << 20), ""), prefetch=False)


def copy_chunks(
    conn: Connection, quoted_table: str, chunks: Iterable[bytes | str], *, prefetch: bool = True
) -> None:
    """One ``COPY ... FROM STDIN`` (:func:`copy_statement`) of ``chunks`` of COPY text.

    :param prefetch: iterate ``chunks`` in a second thread, a chunk or two ahead, while this one
        sends (the drivers release the GIL while they wait for the socket), so formatting and
        checksumming the next rows overlap the server's work on the previous ones. An error in
        ``chunks`` aborts the COPY and is raised here (the caller's transaction rolls back).
    """
    if conn.dialect.name != "postgresql":
        raise ValueError("COPY loads need PostgreSQL")
    sql = copy_statement(quoted_table)
    # The cursor first: the thread starts only where the finally below stops it (a cursor() that
    # raised, on a closed connection, left the thread running for the life of the worker).
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    source: _Prefetch | None = None
    try:
        source = _Prefetch(chunks) if prefetch else None
        stream: Iterator[bytes | str] = iter(source) if source is not None else iter(chunks)
        if conn.dialect.driver == "psycopg2":
            cursor.copy_expert(sql, _Reader(stream), size=1 << 20)
        else:  # psycopg 3
            with cursor.copy(sql) as copy:
                for chunk in stream:
                    copy.write(chunk)
    except Exception as exc:
        if source is not None and source.error is not None and source.error is not exc:
            raise source.error from exc  # the rows' own error, not the aborted COPY's
        deadline = translate(conn, exc, sql)  # the raw cursor bypasses the engine's error hook
        if deadline is not None:
            raise deadline from exc
        raise
    finally:
        if source is not None:
            source.close()
        cursor.close()


class _Reader:
    """A file-like object psycopg2's ``copy_expert`` reads: one chunk per ``read`` call."""

    def __init__(self, chunks: Iterator[bytes | str]) -> None:
        self._chunks = chunks

    def read(self, _size: int = -1) -> bytes | str:
        for chunk in self._chunks:
            if chunk:
                return chunk
        return b""

    def readline(self, _size: int = -1) -> bytes | str:
        return self.read()


class _Prefetch:
    """Iterate ``items`` in a daemon thread, at most ``depth`` items ahead of the consumer.

    The producer's exception is kept (:attr:`error`) and raised to the consumer in its place in the
    sequence; :meth:`close` stops the producer at its next item and waits for it.
    """

    _DONE = object()

    def __init__(self, items: Iterable[Any], depth: int = 2) -> None:
        self.error: BaseException | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(items,), name="onceflow-copy-rows", daemon=True
        )
        self._thread.start()

    def _run(self, items: Iterable[Any]) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer
            self.error = exc
        self._put(self._DONE)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def close(self) -> None:
        """Stop the producer (it ends at its next item) and wait for it."""
        self._stop.set()
        self._thread.join()
