"""Amount columns of a real PostgreSQL shop: an integer amount is read in the unit a setting
names (never guessed), and ``numeric(14,4)`` loads when its extra places are zeros and is
rejected (``sub_cent_amount``) when they are not. The day goes through the real extract, clean
and fenced load; plain SQL over the warehouse is compared with plain SQL over the shop."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from onceflow.sales.clean import PROCESSING_VERSION, clean_orders
from onceflow.sales.engine import make_engine, make_source_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.shop_query import INTEGER_AMOUNT_ENV, ShopSchemaError, read_interval_snapshot

pytestmark = pytest.mark.postgres

DAY = dt.date(2024, 5, 6)
START = dt.datetime(2024, 5, 5, 22, tzinfo=dt.timezone.utc)
END = dt.datetime(2024, 5, 6, 22, tzinfo=dt.timezone.utc)
ORDERS = """CREATE TABLE orders (row_id bigserial PRIMARY KEY, order_id text, event_type text,
    refund_id text, customer_id text, created_at_utc timestamp, ingested_at_utc timestamp,
    amount {amount}, currency text)"""


def shop(url: str, amount_type: str, amounts: list[str]) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(ORDERS.format(amount=amount_type))
        for i, amount in enumerate(amounts):
            conn.execute(
                sa.text(
                    "INSERT INTO orders (order_id, event_type, customer_id, created_at_utc, ingested_at_utc,"
                    " amount, currency) VALUES (:o, 'sale', 'C', :t, :t, CAST(:a AS numeric), 'EUR')"
                ),
                {"o": f"O{i}", "t": dt.datetime(2024, 5, 6, 8, i), "a": amount},
            )
    engine.dispose()


def load_day(url: str) -> tuple[PartitionStore, list[tuple[str, str]]]:
    """Extract, clean and load the day; the warehouse's rows and the rejects' (row id, reason)."""
    source = make_source_engine(url)
    try:
        frame = read_interval_snapshot(source, START, END).frame
    finally:
        source.dispose()
    result = clean_orders(frame, partition=DAY)
    store = PartitionStore(make_engine(url), "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    store.overwrite(lease, result.rows, result.rejects, processing_version=PROCESSING_VERSION)
    rejects = [(r["order_id"], r["reason"]) for r in store.partition_rejects(DAY)]
    return store, rejects


def warehouse_and_shop(
    url: str, shop_cents: str
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        warehouse = conn.execute(
            sa.text(
                "SELECT order_id, gross_cents FROM daily_sales WHERE partition_date = :d ORDER BY order_id"
            ),
            {"d": DAY},
        ).all()
        source = conn.execute(sa.text(f"SELECT order_id, {shop_cents} FROM orders ORDER BY order_id")).all()
    engine.dispose()
    return [tuple(r) for r in warehouse], [tuple(r) for r in source]


def test_an_integer_amount_without_its_unit_set_fails_the_extract_before_any_row(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(INTEGER_AMOUNT_ENV, raising=False)
    shop(postgres_url, "bigint", ["1402"])
    source = make_source_engine(postgres_url)
    try:
        with pytest.raises(ShopSchemaError, match=rf"amount is declared bigint.*{INTEGER_AMOUNT_ENV}=units"):
            read_interval_snapshot(source, START, END)
    finally:
        source.dispose()


@pytest.mark.parametrize(("unit", "shop_cents"), [("cents", "amount"), ("units", "amount * 100")])
def test_an_integer_amount_is_loaded_in_the_unit_the_setting_names(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, unit: str, shop_cents: str
) -> None:
    monkeypatch.setenv(INTEGER_AMOUNT_ENV, unit)
    shop(postgres_url, "bigint", ["1402", "5", "100", "9007199254"])
    _store, rejects = load_day(postgres_url)
    warehouse, source = warehouse_and_shop(postgres_url, shop_cents)
    assert rejects == []
    assert warehouse == source  # 1402 cents is 14.02 EUR; 1402 units is 1402.00 EUR


def test_numeric_14_4_amounts_load_when_exact_and_are_rejected_when_a_cent_fraction_would_be_lost(
    postgres_url: str,
) -> None:
    shop(postgres_url, "numeric(14,4)", ["14.0200", "0.1000", "99999999.9900", "14.0250"])
    store, rejects = load_day(postgres_url)
    warehouse, source = warehouse_and_shop(postgres_url, "(amount * 100)::bigint")
    assert rejects == [("O3", "sub_cent_amount")]
    assert warehouse == [row for row in source if row[0] != "O3"]
    audit = store.audit(DAY)
    assert audit is not None and (audit.row_count, audit.reject_count) == (3, 1)
