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
into a text column become their SQLite text form (``CAST(... AS TEXT)``); text stays as stored; a
blob is decoded as UTF-8 text (a byte that is not UTF-8 kept as a lone surrogate, which cleaning
rejects as ``invalid_text``), never NULL. Event times are placed by their value, not compared as
text (where ``2024-05-05T21:00`` sorts after ``2024-05-05 22:00`` and any number before any text):
:func:`sqlite_utc_text` turns each stored form (ISO 8601 text with a space or ``T``, with or without
fraction or offset; Unix epoch seconds as integer or real) into one fixed-width UTC text, and a
value it cannot place (``06/05/2024``, a date alone, a blob, epoch milliseconds) fails the extract
naming the row, rather than silently landing on no day.

**Integer amounts.** ``amount`` declared as an integer type (PostgreSQL ``smallint``/``integer``/
``bigint``, a SQLite declared type containing ``INT``) says nothing about its unit: 1402 may be
14.02 or 1402.00. The extract refuses it until :data:`INTEGER_AMOUNT_ENV` says which
(``cents`` or ``units``); never a guess that is 100 times off. ``numeric`` and text amounts are
always in units (the currency's major unit, e.g. ``14.02`` EUR).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import re
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from onceflow.sales.schema import ORDER_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Iterator

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


#: ``cents`` or ``units``: what an integer-typed ``amount`` column of the shop counts.
INTEGER_AMOUNT_ENV = "ONCEFLOW_SALES_SHOP_INTEGER_AMOUNT"
INTEGER_AMOUNT_UNITS = ("cents", "units")
#: the SQLite function :func:`sqlite_utc_text` is registered as.
SQLITE_UTC_FUNCTION = "onceflow_utc_text"
#: prefix of :func:`sqlite_utc_text`'s result for a value it cannot place ('!' sorts before digits).
_UNPLACEABLE = "!"
# Epoch seconds at or beyond this (the year 5138) are most likely milliseconds: refused, not guessed.
_EPOCH_SECONDS_LIMIT = 10**11
_EPOCH = dt.datetime(1970, 1, 1)
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


class ShopSchemaError(ValueError):
    """The shop's ``orders`` table has a column this extract cannot read exactly."""


def integer_amount_unit(configured: str | None = None) -> str | None:
    """What an integer ``amount`` counts: ``configured``, else :data:`INTEGER_AMOUNT_ENV`; None if unset.

    :raises ShopSchemaError: the setting is neither ``cents`` nor ``units``.
    """
    raw = (configured if configured is not None else os.environ.get(INTEGER_AMOUNT_ENV, "")).strip().lower()
    if raw and raw not in INTEGER_AMOUNT_UNITS:
        raise ShopSchemaError(f"{INTEGER_AMOUNT_ENV} must be 'cents' or 'units', got {raw!r}")
    return raw or None


def _integer_amount_refused(declared: str) -> ShopSchemaError:
    return ShopSchemaError(
        f"shop column {SHOP_TABLE}.amount is declared {declared}: an integer amount may count cents "
        f"(1402 = 14.02) or whole units (1402 = 1402.00), and a guess is 100 times off. Set "
        f"{INTEGER_AMOUNT_ENV}=cents or {INTEGER_AMOUNT_ENV}=units."
    )


def sqlite_utc_text(value: object) -> str | None:
    """One stored SQLite event time as fixed-width naive UTC text ``YYYY-MM-DD HH:MM:SS.ffffff``.

    Accepts ISO 8601 text (space or ``T``, any fraction up to microseconds, ``Z`` or an offset,
    which is converted to UTC; no offset means UTC) and Unix epoch seconds (integer or real). Any
    other value (a date alone, another text form, a blob, epoch milliseconds) gives ``"!"`` and its
    repr, which sorts before every time, so no day selects it and the extract can name it.
    """
    if value is None:
        return None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not abs(value) < _EPOCH_SECONDS_LIMIT:
                raise ValueError("epoch seconds out of range (milliseconds?)")
            micros = int((Decimal(repr(value)) * 1_000_000).to_integral_value())
            moment = _EPOCH + dt.timedelta(microseconds=micros)
        elif isinstance(value, str):
            text = value.strip()
            if len(text) < 16 or text[10] not in " T":  # a time of day is required
                raise ValueError("not a date and time")
            text = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
            moment = dt.datetime.fromisoformat(text)
            if moment.tzinfo is not None:
                moment = moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
        else:
            raise ValueError("not text or a number")
    except (ValueError, OverflowError, InvalidOperation):
        return _UNPLACEABLE + repr(value)[:200]
    return moment.isoformat(sep=" ", timespec="microseconds")


def register_sqlite_functions(dbapi_connection: Any) -> None:
    """Register :func:`sqlite_utc_text` on a ``sqlite3`` connection (the shop query calls it)."""
    dbapi_connection.create_function(SQLITE_UTC_FUNCTION, 1, sqlite_utc_text, deterministic=True)


@dataclasses.dataclass(frozen=True)
class ShopQuery:
    """The interval query for one shop and how it binds the interval."""

    sql: str
    #: True: the bounds are bound as aware UTC ``timestamptz``; False: as naive UTC.
    aware_bounds: bool
    #: True: the bounds are bound as :func:`sqlite_utc_text`'s fixed-width text (SQLite).
    text_bounds: bool = False

    def params(self, start: dt.datetime, end: dt.datetime) -> dict[str, object]:
        """The query's bind parameters for the interval ``[start, end)``, as the shop database's column type wants them."""
        if self.aware_bounds:
            return {"start": _plain_utc(start), "end": _plain_utc(end)}
        naive = {"start": _plain_utc(start).replace(tzinfo=None), "end": _plain_utc(end).replace(tzinfo=None)}
        if self.text_bounds:
            return {k: v.isoformat(sep=" ", timespec="microseconds") for k, v in naive.items()}
        return dict(naive)


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


def build_postgres(types: dict[str, tuple[str, str]], integer_amount: str | None = None) -> ShopQuery:
    """The interval query for a PostgreSQL shop whose ``orders`` columns have ``types``.

    :param integer_amount: ``cents`` or ``units``: what an integer-typed ``amount`` counts (None:
        an integer ``amount`` is refused).
    :raises ShopSchemaError: a column is missing or of a type that cannot be read exactly.
    """
    _check_present(types)
    select: list[str] = []
    for name in ORDER_COLUMNS:
        base, declared = types[name]
        if name == "amount" and base in _PG_INTEGER:
            if integer_amount is None:
                raise _integer_amount_refused(declared)
            # cents: exact numeric division, two places ("1402" -> "14.02", "-5" -> "-0.05")
            cents = "round(amount::numeric / 100, 2)::text" if integer_amount == "cents" else "amount::text"
            select.append(f"{cents} AS amount")
        elif name in TEXT_COLUMNS:
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


def build_sqlite(columns: dict[str, str] | set[str], integer_amount: str | None = None) -> ShopQuery:
    """The interval query for a SQLite shop (see the module docstring).

    :param columns: ``{column: declared type}`` from ``PRAGMA table_info`` (a set: all untyped).
    :param integer_amount: as :func:`build_postgres`'s, for an ``amount`` declared with ``INT``.

    The event time is compared through :data:`SQLITE_UTC_FUNCTION` (register it on the connection
    with :func:`register_sqlite_functions`); rows whose time it cannot place are selected too, with
    the marker, so :func:`check_placeable` can name them.
    """
    declared = columns if isinstance(columns, dict) else dict.fromkeys(columns, "")
    _check_present({c: ("", "") for c in declared})
    amount_is_integer = "INT" in declared["amount"].upper()
    if amount_is_integer and integer_amount is None:
        raise _integer_amount_refused(f"{declared['amount']} (SQLite integer affinity)")
    select = []
    for c in ORDER_COLUMNS:
        if c == "amount" and amount_is_integer and integer_amount == "cents":
            # Whole cents only: a real or text value in an INT column is passed on as it is, with
            # a suffix cleaning rejects as bad_amount (its raw JSON shows the stored value).
            select.append(
                "CASE WHEN typeof(amount) = 'integer' THEN "
                "(CASE WHEN amount < 0 THEN '-' ELSE '' END) || printf('%d.%02d', abs(amount) / 100, "
                "abs(amount) % 100) WHEN amount IS NULL THEN NULL "
                "ELSE CAST(amount AS TEXT) || ' (not whole cents)' END AS amount"
            )
        elif c in TEXT_COLUMNS:
            select.append(
                f"CASE WHEN typeof({c}) IN ('integer', 'real', 'blob') THEN CAST({c} AS TEXT) ELSE {c} END AS {c}"
            )
        elif c in TIME_COLUMNS:
            select.append(f"{SQLITE_UTC_FUNCTION}({c}) AS {c}")
        else:
            select.append(c)
    sql = (
        f"SELECT * FROM (SELECT {', '.join(select)} FROM {SHOP_TABLE}) "
        f"WHERE (created_at_utc >= :start AND created_at_utc < :end) OR created_at_utc LIKE '{_UNPLACEABLE}%' "
        "ORDER BY row_id"
    )
    return ShopQuery(sql, aware_bounds=False, text_bounds=True)


def _check_present(types: dict[str, tuple[str, str]]) -> None:
    if not types:
        raise ShopSchemaError(f"the shop database has no table {SHOP_TABLE!r} on its search path")
    missing = [c for c in ORDER_COLUMNS if c not in types]
    if missing:
        raise ShopSchemaError(f"shop table {SHOP_TABLE} lacks the columns {missing}; it has {sorted(types)}")


def interval_query(conn: Connection, integer_amount: str | None = None) -> ShopQuery:
    """The interval query for the shop ``conn`` is connected to, from its declared types.

    :param integer_amount: what an integer ``amount`` counts; default :data:`INTEGER_AMOUNT_ENV`.
    """
    unit = integer_amount_unit(integer_amount)
    if conn.dialect.name == "postgresql":
        return build_postgres(postgres_types(conn), unit)
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(f"PRAGMA table_info({SHOP_TABLE})").all()
        register_sqlite_functions(conn.connection.driver_connection)
        return build_sqlite({r[1]: r[2] or "" for r in rows}, unit)
    raise ShopSchemaError(f"shop databases are PostgreSQL or SQLite, not {conn.dialect.name}")


def result_columns(query: ShopQuery) -> sa.TextualSelect:
    """``query`` as a statement whose time columns come back as datetimes (PostgreSQL) or as
    :func:`sqlite_utc_text`'s text (SQLite, parsed by :func:`rows_columns` once checked)."""
    return sa.text(query.sql).columns(
        *(
            sa.column(c, sa.DateTime) if c in TIME_COLUMNS and not query.text_bounds else sa.column(c)
            for c in ORDER_COLUMNS
        )
    )


class SourceExtract(NamedTuple):
    """One read of the shop: the rows and the shop's clock when the read's snapshot began."""

    frame: pd.DataFrame
    watermark_utc: dt.datetime


#: rows per batch the shop's rows are fetched and staged in.
FETCH_ROWS = 50_000


#: one fetched batch, column by column (:func:`rows_columns`): what the extract stages.
OrderColumns = dict[str, list[Any]]


def rows_columns(rows: list[Any]) -> OrderColumns:
    """Fetched rows (columns :data:`ORDER_COLUMNS`) column by column: text as returned, times as
    naive UTC datetimes, row ids as integers. No pandas: the extract task stages these with Arrow
    alone, so its process never imports pandas (about 0.2 s of CPU per task).

    :raises ShopSchemaError: an event time the SQLite shop stores in a form that cannot be placed.
    """
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in ORDER_COLUMNS]
    data: OrderColumns = {}
    for name, values in zip(ORDER_COLUMNS, columns, strict=True):
        if name in TIME_COLUMNS:
            data[name] = _times(name, columns[0], values)
        elif name == "row_id":
            data[name] = _row_ids(values)
        else:
            data[name] = values
    return data


def _row_ids(values: list[Any]) -> list[Any]:
    """``row_id`` as integers. A SQLite shop stores each value by its column's affinity, so a
    ``TEXT`` or ``REAL`` row id comes back as ``'5'`` or ``5.0``: an exact integer is read as one;
    anything else fails naming it (None is left for staging, which refuses a NULL row id)."""
    if all(type(v) is int for v in values):
        return values
    ids: list[Any] = []
    for value in values:
        if value is None or type(value) is int:
            ids.append(value)
        elif (isinstance(value, float) and value.is_integer()) or (
            isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip())
        ):
            ids.append(int(value))
        else:
            raise ShopSchemaError(
                f"shop column {SHOP_TABLE}.row_id holds {value!r:.60}, not an integer: every order "
                "needs an integer row id (declare it INTEGER, or read orders through a view that casts it)"
            )
    return ids


def _times(name: str, row_ids: list[Any], values: list[Any]) -> list[dt.datetime | None]:
    """One time column as naive UTC datetimes: PostgreSQL's as returned (an aware one converted),
    SQLite's :func:`sqlite_utc_text` text parsed once every value is known to be placeable."""
    if not any(isinstance(v, str) for v in values):
        return [v if v is None or v.tzinfo is None else _plain_utc(v).replace(tzinfo=None) for v in values]
    bad = [(r, v) for r, v in zip(row_ids, values, strict=True) if str(v).startswith(_UNPLACEABLE)]
    if bad:
        row_id, value = bad[0]
        raise ShopSchemaError(
            f"shop column {SHOP_TABLE}.{name} of row_id {row_id} holds {value[1:]}, which cannot "
            f"be placed in a day ({len(bad)} such rows in this batch); expected ISO 8601 "
            "text ('2024-05-06 08:00:00', '2024-05-06T08:00:00Z', an offset) or Unix epoch "
            "seconds. Fix the stored value, or read orders through a view that converts it."
        )
    return [None if v is None else dt.datetime.fromisoformat(v) for v in values]


def columns_frame(columns: OrderColumns) -> pd.DataFrame:
    """:func:`rows_columns`' batch as a frame: text as plain objects, times as datetimes (tests,
    :func:`read_interval_snapshot`; the DAG's extract stages the columns without pandas)."""
    import pandas as pd

    data: dict[str, pd.Series] = {}
    for name in ORDER_COLUMNS:
        values = columns[name]
        if name in TEXT_COLUMNS:
            # Plain objects: pandas' string dtype cannot hold the surrogate-escaped bytes a SQLite
            # shop may return (make_source_engine); cleaning rejects those rows.
            data[name] = pd.Series(values, dtype=object)
        elif name in TIME_COLUMNS:
            data[name] = pd.Series(pd.to_datetime(pd.Series(values, dtype=object)))
        else:
            data[name] = pd.Series(values, dtype="int64")
    return pd.DataFrame(data)


def rows_frame(rows: list[Any]) -> pd.DataFrame:
    """Fetched rows (columns :data:`ORDER_COLUMNS`) as a frame (:func:`columns_frame` of :func:`rows_columns`).

    :raises ShopSchemaError: an event time the SQLite shop stores in a form that cannot be placed.
    """
    return columns_frame(rows_columns(rows))


@contextlib.contextmanager
def stream_interval(
    engine: Engine, start: dt.datetime, end: dt.datetime, *, batch_rows: int = FETCH_ROWS
) -> Iterator[tuple[dt.datetime, Iterator[OrderColumns]]]:
    """The shop's clock and the orders of ``[start, end)`` in batches of ``batch_rows``
    (:func:`rows_columns`), in one snapshot.

    The rows come from a server-side cursor on PostgreSQL (``stream_results``), so memory holds one
    batch whatever the day's size; the snapshot (and its transaction) stays open until the block ends.

    The watermark is the shop database's own time at the start of the read (naive UTC), so every
    row committed before it is in the frames. On PostgreSQL extracts of one shop compare without
    trusting the workers' clocks; SQLite computes ``'now'`` in the reading process, so there it is
    the worker's clock (readers of one SQLite shop must share one clock).

    :param engine: the shop's engine (:func:`onceflow.sales.engine.make_source_engine`).
    :raises ShopSchemaError: a column of ``orders`` cannot be read exactly (before any row is read),
        or a SQLite event time cannot be placed in a day.
    """
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Belt and braces: the query converts and compares in UTC explicitly already.
            conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
            clock = sa.text("SELECT (now() AT TIME ZONE 'UTC')::timestamp")
        else:
            clock = sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        query = interval_query(conn)
        watermark = conn.execute(clock).scalar_one()
        if isinstance(watermark, str):
            watermark = dt.datetime.fromisoformat(watermark)
        result = conn.execution_options(stream_results=True, yield_per=batch_rows).execute(
            result_columns(query), query.params(start, end)
        )

        def batches() -> Iterator[OrderColumns]:
            for chunk in result.partitions(batch_rows):
                yield rows_columns(list(chunk))

        try:
            yield watermark, batches()
        finally:
            result.close()


def read_interval_snapshot(engine: Engine, start: dt.datetime, end: dt.datetime) -> SourceExtract:
    """:func:`stream_interval` as one frame (small days, tests; the DAG streams)."""
    import pandas as pd

    with stream_interval(engine, start, end) as (watermark, batches):
        frames = [columns_frame(batch) for batch in batches]
    frame = pd.concat(frames, ignore_index=True) if frames else rows_frame([])
    return SourceExtract(frame, watermark)
