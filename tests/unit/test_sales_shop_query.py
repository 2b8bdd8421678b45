"""The shop query reads each declared column type exactly, or refuses it naming the column."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa

from onceflow.sales.engine import make_source_engine
from onceflow.sales.shop_query import ShopSchemaError, build_postgres, interval_query, result_columns

TEXT = ("text", "text")
TYPES = {
    "row_id": ("int8", "bigint"),
    "order_id": TEXT,
    "event_type": TEXT,
    "refund_id": TEXT,
    "customer_id": ("int8", "bigint"),
    "created_at_utc": ("timestamptz", "timestamp with time zone"),
    "ingested_at_utc": ("timestamptz", "timestamp with time zone"),
    "amount": ("numeric", "numeric(12,2)"),
    "currency": ("bpchar", "character(3)"),
}


def test_typed_columns_are_converted_in_sql_and_the_interval_is_bound_in_utc() -> None:
    query = build_postgres(TYPES)
    assert "customer_id::text AS customer_id" in query.sql
    assert "amount::text AS amount" in query.sql
    assert "(created_at_utc AT TIME ZONE 'UTC') AS created_at_utc" in query.sql
    assert "CAST(:start AS timestamptz)" in query.sql
    start = dt.datetime(2024, 10, 27, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert query.params(start, start)["start"] == dt.datetime(2024, 10, 26, 22, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(
    ("column", "declared", "expected"),
    [
        ("amount", ("float8", "double precision"), "expected text, varchar, char, an integer type, numeric"),
        ("amount", ("money", "money"), "expected text, .* numeric or uuid"),
        ("created_at_utc", ("date", "date"), "expected timestamp or timestamptz"),
        ("row_id", ("text", "text"), "expected an integer type"),
    ],
)
def test_a_type_that_cannot_be_read_exactly_fails_naming_column_and_type(
    column: str, declared: tuple[str, str], expected: str
) -> None:
    with pytest.raises(ShopSchemaError, match=rf"orders\.{column} is declared {declared[1]}; {expected}"):
        build_postgres({**TYPES, column: declared})


def test_a_missing_column_or_table_is_named() -> None:
    with pytest.raises(ShopSchemaError, match=r"lacks the columns \['currency'\]"):
        build_postgres({k: v for k, v in TYPES.items() if k != "currency"})
    with pytest.raises(ShopSchemaError, match="no table 'orders'"):
        build_postgres({})


def test_a_sqlite_shop_reads_integer_and_real_values_as_their_text(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    setup = sa.create_engine(f"sqlite:///{path}")
    with setup.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE orders (row_id INTEGER PRIMARY KEY, order_id TEXT, event_type TEXT, refund_id TEXT,"
            " customer_id BIGINT, created_at_utc DATETIME, ingested_at_utc DATETIME, amount NUMERIC,"
            " currency TEXT)"
        )
        conn.exec_driver_sql(
            "INSERT INTO orders VALUES (1, 'A', 'sale', NULL, 9007199254740993,"
            " '2024-05-06 08:00:00.000000', '2024-05-06 08:00:01.000000', 14.02, 'EUR')"
        )
    setup.dispose()
    engine = make_source_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        query = interval_query(conn)
        start, end = (
            dt.datetime(2024, 5, 6, tzinfo=dt.timezone.utc),
            dt.datetime(2024, 5, 7, tzinfo=dt.timezone.utc),
        )
        [row] = conn.execute(result_columns(query), query.params(start, end)).all()
    engine.dispose()
    assert (row.customer_id, row.amount) == ("9007199254740993", "14.02")
    assert row.created_at_utc == dt.datetime(2024, 5, 6, 8, 0)


@pytest.mark.parametrize("aware", [True, False])
def test_airflows_pendulum_interval_bounds_bind_as_plain_utc_datetimes(aware: bool) -> None:
    """Airflow hands the data interval over as pendulum DateTime; sqlite3 refuses to bind that
    subclass ("type 'DateTime' is not supported"), so the bounds must leave as plain datetimes."""
    import pendulum

    from onceflow.sales.shop_query import ShopQuery

    start = pendulum.datetime(2024, 10, 26, 22, tz="UTC").in_timezone("Europe/Amsterdam")
    params = ShopQuery(sql="", aware_bounds=aware).params(start, start.add(hours=25))
    expected = dt.datetime(2024, 10, 26, 22, tzinfo=dt.timezone.utc if aware else None)
    assert params["start"] == expected and type(params["start"]) is dt.datetime
    assert type(params["end"]) is dt.datetime
    with sa.create_engine("sqlite://").connect() as conn:  # binds without error
        assert conn.execute(sa.text("SELECT :start"), params).scalar() is not None
