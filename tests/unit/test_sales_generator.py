"""The order generator: deterministic, realistic, and covering the hard cases."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter

import pandas as pd

from onceflow.sales.clean import REJECT_REASONS, clean_orders
from onceflow.sales.generator import GeneratorConfig, generate_day, generate_orders
from onceflow.sales.partitions import day_bounds_utc

CONFIG = GeneratorConfig(seed=11)


def test_equal_seeds_give_equal_rows_and_other_seeds_differ() -> None:
    a = generate_orders(dt.date(2024, 3, 29), dt.date(2024, 4, 2), CONFIG)
    assert a == generate_orders(dt.date(2024, 3, 29), dt.date(2024, 4, 2), CONFIG)
    assert a != generate_orders(
        dt.date(2024, 3, 29), dt.date(2024, 4, 2), dataclasses.replace(CONFIG, seed=12)
    )


def test_a_day_alone_equals_the_same_day_inside_a_range() -> None:
    day = dt.date(2024, 10, 27)
    assert generate_day(day, CONFIG) == [
        r
        for r in generate_orders(dt.date(2024, 10, 26), dt.date(2024, 10, 29), CONFIG)
        if r in generate_day(day, CONFIG)
    ]


def test_sales_fall_inside_their_local_day_including_both_edges_on_dst_days() -> None:
    for day in (dt.date(2024, 3, 31), dt.date(2024, 10, 27)):
        start, end = (b.replace(tzinfo=None) for b in day_bounds_utc(day, CONFIG.timezone))
        sales = [
            r
            for r in generate_day(day, CONFIG)
            if r.event_type == "sale" and r.order_id and r.order_id[0] == "O"
        ]
        assert all(start <= r.created_at_utc < end for r in sales)
        times = {r.created_at_utc for r in sales}
        assert start in times and end - dt.timedelta(microseconds=1) in times


def test_the_25_hour_day_has_orders_in_its_repeated_hour() -> None:
    # 2024-10-27 02:00-03:00 local happens twice: 00:00-01:00 and 01:00-02:00 UTC.
    rows = generate_day(dt.date(2024, 10, 27), dataclasses.replace(CONFIG, orders_per_day=500))
    hours = Counter(r.created_at_utc.hour for r in rows if r.created_at_utc.date() == dt.date(2024, 10, 27))
    assert hours[0] > 0 and hours[1] > 0


def test_it_produces_refunds_duplicates_late_rows_and_every_malformed_kind() -> None:
    rows = generate_orders(dt.date(2024, 1, 1), dt.date(2024, 1, 15), CONFIG)
    refunds = [r for r in rows if r.event_type == "refund" and r.refund_id]
    assert refunds
    sale_ids = Counter(r.order_id for r in rows if r.event_type == "sale")
    assert any(n > 1 for n in sale_ids.values())
    assert any(r.ingested_at_utc.date() > r.created_at_utc.date() + dt.timedelta(days=0) for r in rows)
    malformed = [r for r in rows if r.order_id is None or (r.order_id or "").startswith("X")]
    assert len(malformed) == 14 * CONFIG.malformed_per_day
    df = pd.DataFrame([r.as_dict() for r in rows])
    df.insert(0, "row_id", range(1, len(df) + 1))
    result = clean_orders(df, partition=dt.date(2024, 1, 1))
    # Every reason but the unstorable-value ones: a PostgreSQL shop cannot hold NUL bytes,
    # invalid UTF-8 or over-long ids (test_sales_clean and test_sales_unstorable_values cover them).
    unstorable = {"nul_byte", "invalid_text", "value_too_long"}
    # Nor conflicting events under one key: the generator's repeats are exact (test_sales_clean).
    # Nor sub-cent amounts (a numeric(14,4) shop; test_sales_clean covers them).
    absent = unstorable | {"conflicting_duplicate", "sub_cent_amount"}
    assert set(result.reasons()) == set(REJECT_REASONS) - absent
    assert sum(result.reasons().values()) == len(malformed)
