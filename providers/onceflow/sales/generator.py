"""Deterministic generator of realistic shop orders for the daily_sales flow.

Given a seed, a business timezone and a range of local days it produces the same rows every time,
day by day (each day has its own random stream, so generating one day alone or inside a range gives
the same events). The rows carry what real shop databases carry: refunds (sometimes days later),
late-arriving events (ingested after the nightly run), exact duplicates, events at the very edges
of the local day, DST days of 23 and 25 hours, and a few malformed rows, one per reject reason.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from decimal import Decimal
from typing import TYPE_CHECKING

from onceflow.sales.partitions import day_bounds_utc
from onceflow.sales.schema import orders, shop_metadata

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from sqlalchemy.engine import Engine

DEFAULT_TIMEZONE = "Europe/Amsterdam"
_CURRENCIES = (("EUR", 70), ("USD", 15), ("GBP", 10), ("SEK", 5))
# (order_id, event_type, refund_id, amount, currency) overrides, one per reject reason.
_MALFORMED_KINDS = (
    "missing_order_id",
    "unknown_event_type",
    "bad_amount",
    "non_positive_amount",
    "unknown_currency",
    "missing_refund_id",
)


@dataclasses.dataclass(frozen=True)
class OrderRow:
    """One row of the shop's ``orders`` table (``row_id`` is assigned by the database)."""

    order_id: str | None
    event_type: str | None
    refund_id: str | None
    customer_id: str | None
    created_at_utc: dt.datetime
    ingested_at_utc: dt.datetime
    amount: str | None
    currency: str | None

    def as_dict(self) -> dict[str, object]:
        """The order as a dict of column values."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """Knobs of the generator; the defaults give a plausible small shop.

    :param seed: random seed; equal seeds give equal rows.
    :param timezone: business timezone (IANA name).
    :param orders_per_day: mean number of sales per local day.
    :param refund_rate: share of sales refunded (same day or up to 3 days later).
    :param duplicate_rate: share of events recorded twice.
    :param late_rate: share of events ingested after the day ended (after the nightly run).
    :param malformed_per_day: malformed rows per day, cycling through the reject reasons.
    """

    seed: int = 42
    timezone: str = DEFAULT_TIMEZONE
    orders_per_day: int = 200
    refund_rate: float = 0.05
    duplicate_rate: float = 0.02
    late_rate: float = 0.03
    malformed_per_day: int = 2


def _naive_utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None)


def _pick_currency(rng: random.Random) -> str:
    return rng.choices([c for c, _ in _CURRENCIES], weights=[w for _, w in _CURRENCIES])[0]


def _amount(rng: random.Random) -> Decimal:
    # Log-normal basket sizes around 30 units, rounded to cents.
    return Decimal(str(round(min(max(rng.lognormvariate(3.4, 0.6), 1.0), 900.0), 2)))


def _ingested(
    rng: random.Random, created: dt.datetime, day_end: dt.datetime, late_rate: float
) -> dt.datetime:
    if rng.random() < late_rate:
        # Arrives after the local day ended, i.e. after the nightly run read it.
        return max(created, day_end) + dt.timedelta(minutes=rng.randint(5, 600))
    return created + dt.timedelta(seconds=rng.randint(1, 120))


def generate_day(day: dt.date, config: GeneratorConfig) -> list[OrderRow]:
    """All events whose event time falls in local ``day`` (refunds of its sales may fall later).

    :param day: business-local calendar day.
    :param config: generator configuration.
    """
    rng = random.Random(f"{config.seed}:{day.isoformat()}")
    start, end = day_bounds_utc(day, config.timezone)
    span = int((end - start).total_seconds())
    rows: list[OrderRow] = []
    count = max(0, int(rng.gauss(config.orders_per_day, config.orders_per_day**0.5)))
    for i in range(count):
        if i == 0:
            created = start  # the first instant of the day belongs to it (half-open interval)
        elif i == 1:
            created = end - dt.timedelta(microseconds=1)  # the last instant too
        else:
            created = start + dt.timedelta(seconds=rng.randrange(span), microseconds=rng.randrange(10**6))
        order_id = f"O{day:%Y%m%d}-{i:05d}"
        currency = _pick_currency(rng)
        amount = _amount(rng)
        customer = f"C{rng.randint(1, 5000):05d}"
        sale = OrderRow(
            order_id=order_id,
            event_type="sale",
            refund_id=None,
            customer_id=customer,
            created_at_utc=_naive_utc(created),
            ingested_at_utc=_naive_utc(_ingested(rng, created, end, config.late_rate)),
            amount=f"{amount:.2f}",
            currency=currency,
        )
        rows.append(sale)
        if rng.random() < config.duplicate_rate:
            rows.append(
                dataclasses.replace(sale, ingested_at_utc=sale.ingested_at_utc + dt.timedelta(seconds=30))
            )
        if rng.random() < config.refund_rate:
            refunded = min(amount, Decimal(str(round(float(amount) * rng.choice((0.25, 0.5, 1.0)), 2))))
            refund_at = created + dt.timedelta(hours=rng.randint(1, 72))
            rows.append(
                OrderRow(
                    order_id=order_id,
                    event_type="refund",
                    refund_id=f"R{day:%Y%m%d}-{i:05d}",
                    customer_id=customer,
                    created_at_utc=_naive_utc(refund_at),
                    ingested_at_utc=_naive_utc(refund_at + dt.timedelta(seconds=rng.randint(1, 120))),
                    amount=f"{refunded:.2f}",
                    currency=currency,
                )
            )
    for j in range(config.malformed_per_day):
        rows.append(_malformed(rng, day, j, start, span))
    return rows


def _malformed(rng: random.Random, day: dt.date, j: int, start: dt.datetime, span: int) -> OrderRow:
    kind = _MALFORMED_KINDS[(day.toordinal() + j) % len(_MALFORMED_KINDS)]
    created = start + dt.timedelta(seconds=rng.randrange(span))
    row = OrderRow(
        order_id=f"X{day:%Y%m%d}-{j:03d}",
        event_type="sale",
        refund_id=None,
        customer_id=f"C{rng.randint(1, 5000):05d}",
        created_at_utc=_naive_utc(created),
        ingested_at_utc=_naive_utc(created + dt.timedelta(seconds=5)),
        amount="19.99",
        currency="EUR",
    )
    overrides: dict[str, dict[str, str | None]] = {
        "missing_order_id": {"order_id": None},
        "unknown_event_type": {"event_type": "chargeback"},
        "bad_amount": {"amount": "12,50 EUR"},
        "non_positive_amount": {"amount": "-5.00"},
        "unknown_currency": {"currency": "XXX"},
        "missing_refund_id": {"event_type": "refund", "refund_id": None},
    }
    return dataclasses.replace(row, **overrides[kind])  # type: ignore[arg-type]


def iter_days(start: dt.date, end: dt.date) -> Iterator[dt.date]:
    """Local days in the half-open range ``[start, end)``."""
    day = start
    while day < end:
        yield day
        day += dt.timedelta(days=1)


def generate_orders(start: dt.date, end: dt.date, config: GeneratorConfig) -> list[OrderRow]:
    """Events of every local day in ``[start, end)``, in a stable order."""
    return [row for day in iter_days(start, end) for row in generate_day(day, config)]


def write_orders(engine: Engine, rows: Sequence[OrderRow], *, chunk_size: int = 5000) -> int:
    """Create the ``orders`` table if needed and append ``rows``; returns the number written."""
    shop_metadata.create_all(engine, tables=[orders])
    with engine.begin() as conn:
        for i in range(0, len(rows), chunk_size):
            conn.execute(orders.insert(), [r.as_dict() for r in rows[i : i + chunk_size]])
    return len(rows)
