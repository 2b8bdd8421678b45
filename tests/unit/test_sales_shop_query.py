"""The shop query reads each declared column type exactly, or refuses it naming the column."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from onceflow.sales import staging
from onceflow.sales.clean import clean_orders
from onceflow.sales.engine import make_source_engine
from onceflow.sales.schema import ORDER_COLUMNS
from onceflow.sales.shop_query import (
    INTEGER_AMOUNT_ENV,
    ShopSchemaError,
    build_postgres,
    integer_amount_unit,
    read_interval_snapshot,
    stream_interval,
)

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


CREATE = (
    "CREATE TABLE orders (row_id INTEGER PRIMARY KEY, order_id TEXT, event_type TEXT, refund_id TEXT,"
    " customer_id BIGINT, created_at_utc DATETIME, ingested_at_utc DATETIME, amount {amount},"
    " currency TEXT)"
)
# One Amsterdam day in summer: [2024-05-05 22:00, 2024-05-06 22:00) UTC.
START = dt.datetime(2024, 5, 5, 22, tzinfo=dt.timezone.utc)
END = dt.datetime(2024, 5, 6, 22, tzinfo=dt.timezone.utc)


def sqlite_shop(path: Path, rows: list[tuple[object, ...]], amount: str = "NUMERIC") -> str:
    """A SQLite shop file holding ``rows`` as given (sqlite3 stores each value by its own type)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(CREATE.format(amount=amount))
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.commit()
    return f"sqlite:///{path}"


def sale(row_id: int, created: object, **overrides: object) -> tuple[object, ...]:
    values = {
        "order_id": f"O{row_id}", "event_type": "sale", "refund_id": None, "customer_id": "C1",
        "created_at_utc": created, "ingested_at_utc": "2024-05-06 23:00:00.000000", "amount": "14.02",
        "currency": "EUR",
    }  # fmt: skip
    values.update(overrides)
    return (row_id, *(values[c] for c in ORDER_COLUMNS[1:]))


def read(url: str) -> pd.DataFrame:
    engine = make_source_engine(url)
    try:
        return read_interval_snapshot(engine, START, END).frame
    finally:
        engine.dispose()


def epoch(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp())


def test_a_sqlite_shop_reads_integer_and_real_values_as_their_text(tmp_path: Path) -> None:
    url = sqlite_shop(
        tmp_path / "shop.db",
        [sale(1, "2024-05-06 08:00:00.000000", customer_id=9007199254740993, amount=14.02)],
    )
    [row] = read(url).to_dict("records")
    assert (row["customer_id"], row["amount"]) == ("9007199254740993", "14.02")
    assert row["created_at_utc"] == dt.datetime(2024, 5, 6, 8, 0)


def test_every_stored_form_of_a_sqlite_event_time_selects_its_own_day(tmp_path: Path) -> None:
    """Compared as text, ISO with 'T' sorts after a space ('2024-05-05T21:59' >= '2024-05-05 22:00')
    and any number before any text: the day silently gained and lost rows."""
    rows = [
        sale(1, "2024-05-05T21:59:59.999999"),  # 1 us before the day: out (as text: in)
        sale(2, "2024-05-05T22:00:00"),  # the day's first instant: in
        sale(3, "2024-05-06T21:59:59.999999Z"),  # its last microsecond: in (as text: out)
        sale(4, "2024-05-06T22:00:00"),  # the next day: out
        sale(5, epoch(2024, 5, 6, 8)),  # epoch seconds: in (as a number vs text: out)
        sale(6, epoch(2024, 5, 5, 21, 59, 59) + 0.5),  # epoch real before the day: out
        sale(7, epoch(2024, 5, 6, 12) + 0.25),  # epoch real: in, with its fraction
        sale(8, "2024-05-06 23:30:00+02:00"),  # an offset: 21:30 UTC, in (as text: out)
        sale(9, "2024-05-06 12:00:00"),  # no fraction: in
        sale(10, "2024-05-06 22:00:00.000000"),  # the canonical form at the end bound: out
    ]
    frame = read(sqlite_shop(tmp_path / "shop.db", rows))
    got = dict(zip(frame["row_id"], frame["created_at_utc"], strict=True))
    assert got == {
        2: dt.datetime(2024, 5, 5, 22),
        3: dt.datetime(2024, 5, 6, 21, 59, 59, 999999),
        5: dt.datetime(2024, 5, 6, 8),
        7: dt.datetime(2024, 5, 6, 12, 0, 0, 250000),
        8: dt.datetime(2024, 5, 6, 21, 30),
        9: dt.datetime(2024, 5, 6, 12),
    }


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("06/05/2024 10:00", "'06/05/2024 10:00'"),
        ("2024-05-06", "'2024-05-06'"),  # a date alone has no time of day
        (epoch(2024, 5, 6, 8) * 1000, str(epoch(2024, 5, 6, 8) * 1000)),  # milliseconds, not seconds
        (b"2024-05-06 08:00:00", "b'2024-05-06 08:00:00'"),
    ],
)
def test_an_event_time_that_cannot_be_placed_fails_the_extract_naming_the_row(
    tmp_path: Path, stored: object, shown: str
) -> None:
    """Even on another day's row: the extract cannot tell which day it belongs to."""
    url = sqlite_shop(tmp_path / "shop.db", [sale(1, "2024-05-06 08:00:00"), sale(7, stored)])
    with pytest.raises(
        ShopSchemaError, match=rf"orders\.created_at_utc of row_id 7 holds {re.escape(shown)}"
    ):
        read(url)


def test_a_blob_in_a_text_column_is_read_as_its_text_not_null(tmp_path: Path) -> None:
    url = sqlite_shop(
        tmp_path / "shop.db",
        [
            sale(1, "2024-05-06 08:00:00", customer_id=b"C-1", amount=b"12.50", currency=b"EUR"),
            sale(2, "2024-05-06 09:00:00", order_id=b"O\xff2"),  # not UTF-8: kept, then rejected
        ],
    )
    frame = read(url)
    assert frame.loc[0, ["customer_id", "amount", "currency"]].tolist() == ["C-1", "12.50", "EUR"]
    staging.write_extract(tmp_path / "run", frame)
    staged = staging.read_extract(tmp_path / "run").frame
    result = clean_orders(staged, partition=dt.date(2024, 5, 6))
    assert result.rows[["order_id", "customer_id", "gross_cents"]].values.tolist() == [["O1", "C-1", 1250]]
    assert result.rejects[["source_row_id", "reason"]].values.tolist() == [[2, "invalid_text"]]
    assert json.loads(result.rejects["raw"].iloc[0])["order_id"] == "O\udcff2"


@pytest.mark.parametrize("declared", ["TEXT", "REAL", "NUMERIC", ""])
def test_a_sqlite_row_id_stored_as_text_or_real_is_read_as_its_integer(tmp_path: Path, declared: str) -> None:
    """By its column's affinity SQLite may return a row id as '5' (TEXT) or 5.0 (REAL): an exact integer is one
    (the extract staged these before it dropped pandas, and must still)."""
    import sqlite3

    path = tmp_path / "shop.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(
            CREATE.format(amount="NUMERIC").replace("row_id INTEGER PRIMARY KEY", f"row_id {declared}")
        )
        rows = [
            sale(1, "2024-05-06 08:00:00"),
            sale(2, "2024-05-06 09:00:00"),
            sale(3, "2024-05-06 10:00:00"),
        ]
        rows = [(rid, *r[1:]) for rid, r in zip(("5", " 6 ", 7), rows, strict=True)]
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.commit()
    url = f"sqlite:///{path}"
    assert sorted(read(url)["row_id"].tolist()) == [5, 6, 7]
    engine = make_source_engine(url)
    try:
        with stream_interval(engine, START, END) as (_watermark, batches):
            _path, staged = staging.write_extract_stream(tmp_path / "run", batches)
    finally:
        engine.dispose()
    assert staged == 3
    assert sorted(staging.read_extract(tmp_path / "run").frame["row_id"].tolist()) == [5, 6, 7]


@pytest.mark.parametrize("stored", ["5.5", "five", 5.5, "", b"5"])
def test_a_sqlite_row_id_that_is_not_an_integer_fails_the_extract_naming_it(
    tmp_path: Path, stored: object
) -> None:
    import sqlite3

    path = tmp_path / "shop.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(CREATE.format(amount="NUMERIC").replace("row_id INTEGER PRIMARY KEY", "row_id TEXT"))
        conn.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (stored, *sale(1, "2024-05-06 08:00:00")[1:]),
        )
        conn.commit()
    with pytest.raises(ShopSchemaError, match=r"orders\.row_id holds .*, not an integer"):
        read(f"sqlite:///{path}")


def test_staging_refuses_a_value_that_is_not_text_instead_of_storing_null(tmp_path: Path) -> None:
    frame = read(sqlite_shop(tmp_path / "shop.db", [sale(1, "2024-05-06 08:00:00")]))
    frame.loc[0, "customer_id"] = b"C-1"
    with pytest.raises(TypeError, match="extract column customer_id holds a bytes"):
        staging.write_extract(tmp_path / "run", frame)


@pytest.mark.parametrize("declared", ["INTEGER", "BIGINT", "INT"])
def test_an_integer_amount_is_refused_until_its_unit_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, declared: str
) -> None:
    monkeypatch.delenv(INTEGER_AMOUNT_ENV, raising=False)
    url = sqlite_shop(tmp_path / "shop.db", [sale(1, "2024-05-06 08:00:00", amount=1402)], amount=declared)
    with pytest.raises(ShopSchemaError, match=rf"amount is declared {declared}.*{INTEGER_AMOUNT_ENV}=cents"):
        read(url)


@pytest.mark.parametrize(
    ("unit", "expected"), [("cents", [1402, 5, 100]), ("units", [140200, 500, 10000, 1450])]
)
def test_an_integer_amount_is_read_in_the_unit_the_setting_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unit: str, expected: list[int]
) -> None:
    monkeypatch.setenv(INTEGER_AMOUNT_ENV, unit)
    rows = [
        sale(1, "2024-05-06 08:00:00", amount=1402),
        sale(2, "2024-05-06 08:00:01", amount=5),
        sale(3, "2024-05-06 08:00:02", amount=100),
        sale(4, "2024-05-06 08:00:03", amount=14.5),  # a real in an INTEGER column
    ]
    frame = read(sqlite_shop(tmp_path / "shop.db", rows, amount="INTEGER"))
    result = clean_orders(frame, partition=dt.date(2024, 5, 6))
    assert result.rows["gross_cents"].tolist() == expected
    # In cents, 14.5 is not whole cents: rejected with the stored value, not read as 14.50
    assert result.rejects[["source_row_id", "reason"]].values.tolist() == (
        [[4, "bad_amount"]] if unit == "cents" else []
    )


def test_an_integer_amount_setting_that_is_not_a_unit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INTEGER_AMOUNT_ENV, "pennies")
    with pytest.raises(ShopSchemaError, match="must be 'cents' or 'units'"):
        integer_amount_unit()


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
