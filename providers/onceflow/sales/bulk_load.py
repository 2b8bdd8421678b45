"""Writing a DataFrame of sales rows into the warehouse table: COPY, INSERT and the baselines.

COPY uses PostgreSQL's **text** format, built column-wise by pandas: tab-separated, ``\\N`` for
NULL, and backslash, tab, newline and carriage return escaped inside values. Unlike CSV, text
format has no "unquoted empty field" ambiguity: an empty string is an empty field and only ``\\N``
is NULL (a value that is literally ``\\N`` is written ``\\\\N``). So ``customer_id = ""`` stays
``""`` and the stored rows equal the frame on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from onceflow.sales.deadlines import translate
from onceflow.sales.schema import SALES_COLUMNS

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection

LoadMethod = Literal["auto", "copy", "insert", "executemany", "to_sql"]
COPY_NULL = "\\N"


def frame_records(df: pd.DataFrame, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows of ``df`` as tuples of plain Python values (ints, str, date, datetime, None)."""
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
    buf = io.StringIO()
    if rows.empty:
        return buf
    texts = [_copy_text_column(rows[name]) for name in columns]
    lines = texts[0].str.cat(pd.concat(texts[1:], axis=1), sep="\t")
    buf.write("\n".join(lines.tolist()))
    buf.write("\n")
    buf.seek(0)
    return buf


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
    if conn.dialect.name != "postgresql":
        raise ValueError("COPY loads need PostgreSQL")
    sql = copy_statement(quoted_table)
    buf = copy_text(rows)
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.driver == "psycopg2":
            cursor.copy_expert(sql, buf)
        else:  # psycopg 3
            with cursor.copy(sql) as copy:
                for chunk in iter(lambda: buf.read(1 << 20), ""):
                    copy.write(chunk)
    except Exception as exc:
        deadline = translate(conn, exc, sql)  # the raw cursor bypasses the engine's error hook
        if deadline is not None:
            raise deadline from exc
        raise
    finally:
        cursor.close()
