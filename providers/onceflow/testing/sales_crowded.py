"""Crowded random days of shop ``orders`` rows for the daily_sales property tests (issue 29 review).

Few event keys, so many rows share one; ids and customers drawn from awkward text (NULL, empty, the
text ``None``, tabs, newlines, carriage returns, backslashes, ``\\N``, unit separators, non-ASCII),
amounts written several ways and malformed, event times at microsecond edges, rows derived from
earlier rows with one or two fields changed (exact repeats and conflicts), unique row ids in no
order. Columns as the shop extract hands them over (text as plain objects).
"""

from __future__ import annotations

import datetime as dt
import random

import pandas as pd

from onceflow.sales.schema import ORDER_COLUMNS

DAY = dt.date(2024, 10, 27)
T0 = dt.datetime(2024, 10, 26, 22, 0)  # the day's first UTC instant in Europe/Amsterdam
TEXT = ("order_id", "event_type", "refund_id", "customer_id", "amount", "currency")
PIECES = ["", "None", "None", "nan", "\x1f", "\t", "\n", "\r", "\\", "\\N", "a", "é", "🙂", " ", "NULL", ":"]
#: Currencies of new events; ``XXX`` (ISO 4217's "no currency") has no rate, so it is rejected.
CURRENCIES = ["EUR", "EUR", "USD", "GBP", "SEK", "XXX", None]
#: A variant of an earlier row changes its currency to one of these.
VARIANT_CURRENCIES = ["EUR", "USD", "SEK", "XXX", None]
AMOUNTS = ["10", "10.0", "10.00", " 10.00 ", "10.000", "010.00", "12.34", "0.01", "999999999999.99",
           "10.001", "0.00", "-1.00", "1e3", "", None, "\u0661\u0660.\u0665\u0660"]  # fmt: skip


def awkward(rng: random.Random) -> str | None:
    """A short id: NULL, or one to three awkward pieces (often colliding with other rows')."""
    if rng.random() < 0.15:
        return None
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))


def random_day(seed: int) -> pd.DataFrame:
    """A crowded day: rows derived from a few base events with one or two fields changed."""
    rng = random.Random(seed)
    n = rng.randint(1, 90)
    keys = [awkward(rng) or "K" for _ in range(rng.randint(1, 6))]
    times = [T0 + dt.timedelta(microseconds=rng.choice([0, 1, 999_999, 10**6, 3_600 * 10**6 + 1]))
             for _ in range(3)]  # fmt: skip
    rows: list[dict[str, object]] = []
    for _ in range(n):
        if rows and rng.random() < 0.6:  # a variant of an earlier row: a repeat or a conflict
            row = dict(rng.choice(rows))
            for field in rng.sample(["customer_id", "refund_id", "order_id", "amount", "currency",
                                     "created_at_utc", "ingested_at_utc", "ingested_at_utc"],
                                    rng.randint(0, 2)):  # fmt: skip
                row[field] = {
                    "customer_id": lambda: awkward(rng),
                    "refund_id": lambda: awkward(rng),
                    "order_id": lambda: rng.choice(keys),
                    "amount": lambda: rng.choice(AMOUNTS),
                    "currency": lambda: rng.choice(VARIANT_CURRENCIES),
                    "created_at_utc": lambda: rng.choice(times),
                    "ingested_at_utc": lambda: rng.choice(times) + dt.timedelta(seconds=rng.randint(0, 2)),
                }[field]()
        else:
            kind = rng.choice(["sale", "sale", "refund", "refund", "chargeback", None])
            row = {
                "order_id": rng.choice([*keys, None, "   "]),
                "event_type": kind,
                "refund_id": rng.choice(keys) if kind == "refund" and rng.random() < 0.9 else awkward(rng),
                "customer_id": awkward(rng),
                "created_at_utc": rng.choice(times),
                "ingested_at_utc": rng.choice(times) + dt.timedelta(seconds=rng.randint(0, 2)),
                "amount": rng.choice(AMOUNTS),
                "currency": rng.choice(CURRENCIES),
            }
        rows.append(row)
    ids = rng.sample(range(1, 10 * n + 10), n)  # unique, in no particular order
    for row, row_id in zip(rows, ids, strict=True):
        row["row_id"] = row_id
    rng.shuffle(rows)
    return pd.DataFrame(
        {c: pd.Series([r[c] for r in rows], dtype=object if c in TEXT else None) for c in ORDER_COLUMNS}
    )
