"""The shop's ``orders`` query, built from the column types the shop declares.

Real shops do not all store ``orders`` as text: ``customer_id`` may be ``bigint``, ``amount``
``numeric(12,2)``, the event times ``timestamptz``. Each column is converted **in SQL, exactly**,
into the form cleaning reads (text for ids and amounts, naive UTC for times):

* text columns (``order_id``, ``event_type``, ``refund_id``, ``customer_id``, ``amount``,
  ``currency``): ``text``/``varchar``/``char`` as they are; integers, ``numeric`` and ``uuid`` by
  their exact text form (``numeric`` keeps its scale: ``14.02``, ``14.00``).
* times (``created_at_utc``, ``ingested_at_utc``): ``timestamp`` as naive UTC; ``timestamptz`` by
  ``AT TIME ZONE 'UTC'``, and the interval is compared as ``timestamptz`` literals with an explicit
  ``+00:00``, so the session's time zone shifts nothing.
* ``row_id``: any integer type.

Any other type (``double precision``: not exact; ``money``: locale text; ``date``: no time) fails
the extract at once with :class:`ShopSchemaError` naming the column, its type and what was
expected, before a row is read: never a NULL, never a silently wrong value.

SQLite declares affinities, not types, and a value's own type decides: integers and reals read
into a text column become their SQLite text form (``CAST(... AS TEXT)``); text stays as stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, NamedTuple

import sqlalchemy as sa

from onceflow.sales.schema import ORDER_COLUMNS

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy.engine import Connection, Engine

SHOP_TABLE = "orders"
TEXT_COLUMNS = ("order_id", "event_type", "refund_id", "customer_id", "amount", "currency")
TIME_COLUMNS = ("created_at_utc", "ingested_at_utc")
_PG_TEXT = {"text", "varchar", "bpchar", "name", "citext"}
_PG_INTEGER = {"int2", "int4", "int8"}
_PG_AS_TEXT = _PG_TEXT | _PG_INTEGER | {"numeric", "uuid"}
_EXPECTED = {
    "text": "text, varchar, char, an integer type, numeric or uuid",
    "time": "timestamp or timestamptz",
    "row_id": "an integer type",
}


class ShopSchemaError(ValueError):
    """The shop's ``orders`` table has a column this extract cannot read exactly."""


@dataclasses.dataclass(frozen=True)
class ShopQuery:
    """The interval query for one shop and how it binds the interval."""

    sql: str
    #: True: the bounds are bound as aware UTC ``timestamptz``; False: as naive UTC.
    aware_bounds: bool

    def params(self, start: dt.datetime, end: dt.datetime) -> dict[str, object]:
        """The query's bind parameters for the interval ``[start, end)``, as the shop database's column type wants them."""
        if self.aware_bounds:
            return {"start": _plain_utc(start), "end": _plain_utc(end)}
        return {"start": _plain_utc(start).replace(tzinfo=None), "end": _plain_utc(end).replace(tzinfo=None)}


def _plain_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC as a plain ``datetime``: Airflow hands the interval over as pendulum
    ``DateTime``, a subclass that sqlite3's adapters (registered per exact type) refuse to bind."""
    utc = value.astimezone(dt.timezone.utc)
    return dt.datetime(
        utc.year,
        utc.month,
        utc.day,
        utc.hour,
        utc.minute,
        utc.second,
        utc.microsecond,
        tzinfo=dt.timezone.utc,
    )


def _refuse(column: str, declared: str, kind: str) -> ShopSchemaError:
    return ShopSchemaError(
        f"shop column {SHOP_TABLE}.{column} is declared {declared}; expected {_EXPECTED[kind]} "
        "(read exactly, never as NULL). Change the column's type in the shop, or cast it in a view "
        f"named {SHOP_TABLE}."
    )


def postgres_types(conn: Connection) -> dict[str, tuple[str, str]]:
    """``{column: (base type name, declared type)}`` of the ``orders`` the session resolves."""
    rows = conn.execute(
        sa.text(
            "SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod) "
            "FROM pg_attribute a JOIN pg_type bt ON bt.oid = a.atttypid "
            # a domain reads as its base type
            "JOIN pg_type t ON t.oid = CASE WHEN bt.typtype = 'd' THEN bt.typbasetype ELSE bt.oid END "
            "WHERE a.attrelid = to_regclass(:table) AND a.attnum > 0 AND NOT a.attisdropped"
        ),
        {"table": SHOP_TABLE},
    ).all()
    return {name: (base, declared) for name, base, declared in rows}


def build_postgres(types: dict[str, tuple[str, str]]) -> ShopQuery:
    """The interval query for a PostgreSQL shop whose ``orders`` columns have ``types``.

    :raises ShopSchemaError: a column is missing or of a type that cannot be read exactly.
    """
    _check_present(types)
    select: list[str] = []
    for name in ORDER_COLUMNS:
        base, declared = types[name]
        if name in TEXT_COLUMNS:
            if base not in _PG_AS_TEXT:
                raise _refuse(name, declared, "text")
            select.append(f"{name}::text AS {name}" if base not in _PG_TEXT - {"bpchar"} else name)
        elif name in TIME_COLUMNS:
            if base == "timestamptz":
                select.append(f"({name} AT TIME ZONE 'UTC') AS {name}")
            elif base == "timestamp":
                select.append(name)
            else:
                raise _refuse(name, declared, "time")
        else:  # row_id
            if base not in _PG_INTEGER:
                raise _refuse(name, declared, "row_id")
            select.append(f"{name}::bigint AS {name}")
    aware = types["created_at_utc"][0] == "timestamptz"
    bound = "CAST(:{} AS timestamptz)" if aware else "CAST(:{} AS timestamp)"
    sql = (
        f"SELECT {', '.join(select)} FROM {SHOP_TABLE} "
        f"WHERE created_at_utc >= {bound.format('start')} AND created_at_utc < {bound.format('end')} "
        "ORDER BY row_id"
    )
    return ShopQuery(sql, aware)


def build_sqlite(columns: set[str]) -> ShopQuery:
    """The interval query for a SQLite shop (see the module docstring)."""
    _check_present({c: ("", "") for c in columns})
    select = [
        f"CASE WHEN typeof({c}) IN ('integer', 'real') THEN CAST({c} AS TEXT) ELSE {c} END AS {c}"
        if c in TEXT_COLUMNS
        else c
        for c in ORDER_COLUMNS
    ]
    sql = (
        f"SELECT {', '.join(select)} FROM {SHOP_TABLE} "
        "WHERE created_at_utc >= :start AND created_at_utc < :end ORDER BY row_id"
    )
    return ShopQuery(sql, aware_bounds=False)


def _check_present(types: dict[str, tuple[str, str]]) -> None:
    if not types:
        raise ShopSchemaError(f"the shop database has no table {SHOP_TABLE!r} on its search path")
    missing = [c for c in ORDER_COLUMNS if c not in types]
    if missing:
        raise ShopSchemaError(f"shop table {SHOP_TABLE} lacks the columns {missing}; it has {sorted(types)}")


def interval_query(conn: Connection) -> ShopQuery:
    """The interval query for the shop ``conn`` is connected to, from its declared types."""
    if conn.dialect.name == "postgresql":
        return build_postgres(postgres_types(conn))
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(f"PRAGMA table_info({SHOP_TABLE})").all()
        return build_sqlite({r[1] for r in rows})
    raise ShopSchemaError(f"shop databases are PostgreSQL or SQLite, not {conn.dialect.name}")


def result_columns(query: ShopQuery) -> sa.TextualSelect:
    """``query`` as a statement whose time columns come back as datetimes on every backend."""
    return sa.text(query.sql).columns(
        *(sa.column(c, sa.DateTime) if c in TIME_COLUMNS else sa.column(c) for c in ORDER_COLUMNS)
    )


class SourceExtract(NamedTuple):
    """One read of the shop: the rows and the shop's clock when the read's snapshot began."""

    frame: pd.DataFrame
    watermark_utc: dt.datetime


def read_interval_snapshot(engine: Engine, start: dt.datetime, end: dt.datetime) -> SourceExtract:
    """The orders of ``[start, end)`` and the shop's clock, read in one snapshot.

    The watermark is the shop database's own time at the start of the read (naive UTC), so every
    row committed before it is in the frame. On PostgreSQL extracts of one shop compare without
    trusting the workers' clocks; SQLite computes ``'now'`` in the reading process, so there it is
    the worker's clock (readers of one SQLite shop must share one clock).

    :param engine: the shop's engine (:func:`onceflow.sales.engine.make_source_engine`).
    :raises ShopSchemaError: a column of ``orders`` cannot be read exactly (before any row is read).
    """
    import pandas as pd

    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Belt and braces: the query converts and compares in UTC explicitly already.
            conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
            clock = sa.text("SELECT (now() AT TIME ZONE 'UTC')::timestamp")
        else:
            clock = sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        query = interval_query(conn)
        watermark = conn.execute(clock).scalar_one()
        rows = conn.execute(result_columns(query), query.params(start, end)).all()
    if isinstance(watermark, str):
        watermark = dt.datetime.fromisoformat(watermark)
    # Text as plain objects: pandas' string dtype cannot hold the surrogate-escaped bytes a
    # SQLite shop may return (make_source_engine); cleaning rejects those rows.
    frame = pd.DataFrame(
        {
            name: pd.Series([r[i] for r in rows], dtype=object if name in TEXT_COLUMNS else None)
            for i, name in enumerate(ORDER_COLUMNS)
        }
    )
    return SourceExtract(frame, watermark)
