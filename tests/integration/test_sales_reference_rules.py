"""The independent SQL reference (testing/sql/sales_reference.sql) applies cleaning's rules.

Backfill equality compares every partition with the reference, so a cleaning rule the reference
lacks shows up as a mismatch on the days where it matters. Here: a PostgreSQL shop whose id
columns are plain ``text`` (a real shop need not share our ``varchar(64)``) holds ids longer than
the warehouse's columns; cleaning rejects them (``value_too_long``) and the reference must count
them as rejects too. (NUL bytes and text that is not UTF-8, the other rows cleaning rejects as
unstorable, cannot exist in a PostgreSQL shop.) Warehouse on SQLite and PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.sales.partitions import day_bounds_utc
from onceflow.testing.sales_backfill import day_by_day_pass, reference_totals

if TYPE_CHECKING:
    from collections.abc import Callable

TZ = "Europe/Amsterdam"
DAY = dt.date(2024, 3, 31)  # 23 hours


def test_the_reference_rejects_ids_longer_than_the_warehouse_columns(
    postgres_url_factory: Callable[..., str], sales_db_url: str
) -> None:
    shop = postgres_url_factory("shop")
    engine = make_engine(shop)
    try:
        write_orders(
            engine,
            generate_orders(DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=1), GeneratorConfig(seed=12)),
        )
        start, _ = day_bounds_utc(DAY, TZ)
        at = (start + dt.timedelta(hours=10)).replace(tzinfo=None)
        with engine.begin() as conn:
            for column in ("order_id", "refund_id", "customer_id"):
                conn.execute(sa.text(f"ALTER TABLE orders ALTER COLUMN {column} TYPE text"))
            conn.execute(
                sa.text(
                    "INSERT INTO orders (order_id, event_type, refund_id, customer_id, created_at_utc,"
                    " ingested_at_utc, amount, currency) VALUES"
                    " (:long, 'sale', NULL, 'C1', :at, :at, '10.00', 'EUR'),"
                    " ('L-2', 'sale', NULL, :long, :at, :at, '11.00', 'EUR'),"
                    " (:wide, 'sale', NULL, :wide, :at, :at, '12.00', 'EUR')"
                ),
                {"long": "L" * 65, "wide": "W" * 64, "at": at},
            )
    finally:
        engine.dispose()

    by_sql = reference_totals(shop, [DAY], timezone=TZ)[DAY.isoformat()]
    loaded = day_by_day_pass(shop, sales_db_url, [DAY], timezone=TZ)[DAY.isoformat()]

    assert (by_sql.row_count, by_sql.reject_count, by_sql.net_cents) == (
        loaded.row_count,
        loaded.reject_count,
        loaded.net_cents,
    )
    assert loaded.reject_count >= 2 and loaded.row_count > 1  # two long ids and the generator's own


def test_the_reference_rejects_conflicting_events_under_one_key_like_cleaning(
    postgres_url_factory: Callable[..., str], sales_db_url: str
) -> None:
    shop = postgres_url_factory("shop")
    engine = make_engine(shop)
    try:
        write_orders(
            engine,
            generate_orders(DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=1), GeneratorConfig(seed=12)),
        )
        start, _ = day_bounds_utc(DAY, TZ)
        at = (start + dt.timedelta(hours=10)).replace(tzinfo=None)
        later = at + dt.timedelta(minutes=5)
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO orders (order_id, event_type, refund_id, customer_id, created_at_utc,"
                    " ingested_at_utc, amount, currency) VALUES"
                    " ('K-1', 'sale', NULL, 'C1', :at, :at, '20.00', 'EUR'),"
                    " ('K-2', 'sale', NULL, 'C2', :at, :at, '30.00', 'EUR'),"
                    " ('K-1', 'refund', 'RK', 'C1', :at, :at, '5.00', 'EUR'),"
                    " ('K-2', 'refund', 'RK', 'C2', :at, :later, '7.00', 'EUR'),"  # RK reused: conflict
                    " ('K-2', 'refund', 'RK', 'C2', :at, :later, '7.0', 'EUR'),"  # exact repeat of the kept
                    " ('K-1', 'sale', NULL, 'C1', :at, :later, '21.00', 'EUR')"  # corrected amount: conflict
                ),
                {"at": at, "later": later},
            )
    finally:
        engine.dispose()

    by_sql = reference_totals(shop, [DAY], timezone=TZ)[DAY.isoformat()]
    loaded = day_by_day_pass(shop, sales_db_url, [DAY], timezone=TZ)[DAY.isoformat()]
    assert (by_sql.row_count, by_sql.reject_count, by_sql.net_cents) == (
        loaded.row_count,
        loaded.reject_count,
        loaded.net_cents,
    )
    assert loaded.reject_count >= 2  # the reused refund id and the corrected sale
