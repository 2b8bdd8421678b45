"""Cleaning's rules on plain Python rows: what the clean task runs, without pandas.

The rules are stated in :mod:`onceflow.sales.clean`, whose ``clean_orders`` applies them to a whole
day in pandas. That stays the reference: ``tests/unit/test_sales_clean_stream.py`` compares this
module's results with it, rejects and all, on generated messy days, and
``tests/unit/test_sales_clean_rules.py`` each row's reject reason and reject row, awkward value by
awkward value in every column. The task runs this one because pandas costs 0.2 to 0.3 s of CPU to
import in every clean task process the scheduler does not preload it into (issue 27), and the
rules look at one row, or at the rows of one key or one order, at a time: plain Python does that
about as fast.

A row is a :class:`Row` (the shop's ``orders`` columns, text as ``str`` with stray bytes as lone
surrogates, as the shop read them); the constants and per-value helpers here are shared with
:mod:`onceflow.sales.clean`.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
import re
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

from onceflow.sales.schema import ID_LENGTH, ORDER_COLUMNS, ORDER_TEXT_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

# Fixed rates into EUR (units of EUR per unit of currency). Versioned with PROCESSING_VERSION:
# changing a rate changes results, so it must change the processing version too.
RATES_TO_EUR: Mapping[str, Decimal] = {
    "EUR": Decimal("1"),
    "USD": Decimal("0.92"),
    "GBP": Decimal("1.17"),
    "SEK": Decimal("0.087"),
}
# v2: rows the warehouse cannot store (nul_byte, invalid_text, value_too_long) are rejected.
# v3: rows that share an event key but differ as events are rejected (conflicting_duplicate).
# v4: amounts with more than two decimal places are accepted when the extra digits are zeros
#     (a numeric(14,4) column), else rejected as sub_cent_amount (they were all bad_amount).
# v5: a NULL and the text "None", or ids holding \x1f, no longer make two different events one
#     (the second was dropped as an exact repeat): it is a conflicting_duplicate.
PROCESSING_VERSION = "sales-clean-v5"
REJECT_REASONS: tuple[str, ...] = (
    "nul_byte",
    "invalid_text",
    "value_too_long",
    "missing_order_id",
    "unknown_event_type",
    "missing_refund_id",
    "bad_amount",
    "sub_cent_amount",
    "non_positive_amount",
    "unknown_currency",
    "conflicting_duplicate",
)
# What makes two rows under one key the same event (row_id and ingested_at_utc do not).
EVENT_FIELDS = ("event_type", "order_id", "refund_id", "customer_id", "created_at_utc", "currency")
# At most 12 integer digits (no bigint overflow in cents), any number of decimals; digits beyond
# the cents must be zeros (CENTS_EXACT_RE), else the amount is rejected rather than rounded.
AMOUNT_RE = re.compile(r"^-?\d{1,12}(\.\d+)?$")
CENTS_EXACT_RE = re.compile(r"^-?\d{1,12}(\.\d{1,2}0*)?$")
ZERO_RE = re.compile(r"-?0+(\.0+)?")
TEXT_COLUMNS = ORDER_TEXT_COLUMNS
# Columns that reach the warehouse's varchar(ID_LENGTH) columns as they are.
STORED_ID_COLUMNS = ("order_id", "customer_id")
# A lone surrogate: how a byte that is not UTF-8 arrives (the shop engine decodes with
# surrogateescape, so the byte is kept rather than failing the extract).
SURROGATE = re.compile("[\ud800-\udfff]")
CENT = Decimal("0.01")
_EVENT_TYPES = ("sale", "refund")


class Row(NamedTuple):
    """One source row, fields in :data:`~onceflow.sales.schema.ORDER_COLUMNS` order."""

    row_id: int
    order_id: str | None
    event_type: str | None
    refund_id: str | None
    customer_id: str | None
    created_at_utc: dt.datetime | None
    ingested_at_utc: dt.datetime | None
    amount: str | None
    currency: str | None


#: A row's :data:`TEXT_COLUMNS` values, in one C call.
_text_values = operator.itemgetter(*(Row._fields.index(c) for c in TEXT_COLUMNS))


class SalesRow(NamedTuple):
    """One output row, fields in :data:`~onceflow.sales.schema.SALES_COLUMNS` order."""

    partition_date: dt.date
    order_id: str
    customer_id: str | None
    source_currency: str | None
    gross_cents: int
    refund_cents: int
    net_cents: int
    event_count: int
    first_event_utc: dt.datetime | None


class Reject(NamedTuple):
    """One reject, fields in :data:`~onceflow.sales.schema.REJECT_COLUMNS` order."""

    source_row_id: int
    order_id: str | None
    reason: str
    raw: str


def raw_json(row: Mapping[Any, object]) -> str:
    """The whole source row as ASCII JSON: what a reject keeps (NUL as ``\\u0000``, a stray byte's
    surrogate as ``\\udcXX``)."""

    def plain(v: object) -> object:
        if v is None or v != v:  # NaN, and pandas' NaT in the reference's frames
            return None
        if isinstance(v, dt.datetime):
            return v.isoformat(sep=" ", timespec="microseconds")
        return v if isinstance(v, str | int) else str(v)

    return json.dumps({k: plain(row[k]) for k in ORDER_COLUMNS}, sort_keys=True)


def storable_id(value: object) -> str | None:
    """A reject's ``order_id`` as the warehouse can store it: escaped, cut to the column width.

    The whole value stays in the reject's raw JSON; this column is for finding the row.
    """
    if not isinstance(value, str):
        return None
    text = value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if len(text) <= ID_LENGTH else text[: ID_LENGTH - 3] + "..."


def to_cents(amount: str, currency: str, reporting: str) -> int:
    """``amount`` of ``currency`` in cents of ``reporting``, rounded half-even."""
    value = Decimal(amount) * RATES_TO_EUR[currency] / RATES_TO_EUR[reporting]
    return int(value.quantize(CENT, rounding=ROUND_HALF_EVEN) * 100)


def _blank(value: str | None) -> bool:
    return value is None or value.strip() == ""


def reject_reason(row: Row) -> str | None:
    """The first reason of :data:`REJECT_REASONS` (but the last, a comparison of rows) that
    rejects ``row`` alone, or None for a valid row."""
    # One string of every text value: a NUL or a surrogate in it is in one of them (cheaper than
    # asking each value, and the question is the same for all six).
    joined = "".join(v for v in _text_values(row) if v is not None)
    if "\x00" in joined:
        return "nul_byte"
    if not joined.isascii() and SURROGATE.search(joined):
        return "invalid_text"
    if any(v is not None and len(v) > ID_LENGTH for v in (row.order_id, row.customer_id)):
        return "value_too_long"
    if _blank(row.order_id):
        return "missing_order_id"
    if row.event_type not in _EVENT_TYPES:
        return "unknown_event_type"
    if row.event_type == "refund" and _blank(row.refund_id):
        return "missing_refund_id"
    amount = None if row.amount is None else row.amount.strip()
    if amount is None or AMOUNT_RE.fullmatch(amount) is None:
        return "bad_amount"
    if CENTS_EXACT_RE.fullmatch(amount) is None:
        return "sub_cent_amount"
    if amount.startswith("-") or ZERO_RE.fullmatch(amount) is not None:
        return "non_positive_amount"
    if row.currency not in RATES_TO_EUR:
        return "unknown_currency"
    return None


def reject(row: Row, reason: str) -> Reject:
    """``row`` rejected for ``reason``."""
    return Reject(row.row_id, storable_id(row.order_id), reason, raw_json(row._asdict()))


def event_key(row: Row) -> str:
    """What identifies a valid row's event: a sale by its order id, a refund by its refund id."""
    return f"{row.event_type}:{row.order_id if row.event_type == 'sale' else row.refund_id}"


def _event(row: Row) -> tuple[object, ...]:
    # Equal amounts written differently ("10.0", "10.00") are one event; a NULL is not "None".
    amount = Decimal(str(row.amount).strip()).quantize(CENT)
    return (
        amount,
        row.event_type,
        row.order_id,
        row.refund_id,
        row.customer_id,
        row.created_at_utc,
        row.currency,
    )


def _time_key(value: dt.datetime | None) -> tuple[bool, dt.datetime]:
    """A timestamp's sort key, a missing one last (as pandas sorts NaT)."""
    return (value is None, value or dt.datetime.min)


def dedupe_positions(valid: Sequence[Row]) -> tuple[list[int], list[int], int]:
    """``(positions of the kept events, positions of the rows conflicting with a kept event, exact
    repeats dropped)`` of valid rows given in source row id order.

    Of the rows under one :func:`event_key` the latest ingested wins (ties: the higher row id,
    then the later given); a row equal to the winner as an event (all of :data:`EVENT_FIELDS` and
    the amount in cents) is an exact repeat, any other conflicts. Winners come in key order, the
    conflicts in row id order."""
    keys = [event_key(row) for row in valid]
    keyed = sorted(
        range(len(valid)),
        key=lambda i: (keys[i], *_time_key(valid[i].ingested_at_utc), valid[i].row_id, i),
    )
    winners: list[int] = []
    losers: list[tuple[int, int, int]] = []  # (row id, place in key order, position) of rows that lost
    winner_of: dict[str, tuple[object, ...]] = {}
    for place, i in enumerate(keyed):
        if place + 1 == len(keyed) or keys[keyed[place + 1]] != keys[i]:
            winners.append(i)
            winner_of[keys[i]] = _event(valid[i])
        else:
            losers.append((valid[i].row_id, place, i))
    losers.sort()
    conflicting = [i for _, _, i in losers if _event(valid[i]) != winner_of[keys[i]]]
    return winners, conflicting, len(losers) - len(conflicting)


def dedupe(valid: Sequence[Row]) -> tuple[list[Row], list[Row], int]:
    """:func:`dedupe_positions` as rows: ``(kept events, conflicting rows, exact repeats dropped)``."""
    winners, conflicting, repeats = dedupe_positions(valid)
    return [valid[i] for i in winners], [valid[i] for i in conflicting], repeats


def net_per_order(events: Iterable[Row], partition: dt.date, reporting: str) -> list[SalesRow]:
    """One row per order of the kept events, sorted by order id: gross of its sales, refunds, net,
    the customer and currency of its first event naming one (sales first, then by event time)."""
    by_order: dict[str, list[Row]] = {}
    for row in events:
        by_order.setdefault(str(row.order_id), []).append(row)
    out = []
    for order_id in sorted(by_order):
        rows = by_order[order_id]
        if len(rows) == 1:  # most orders: one sale, or one refund of an earlier day's order
            r = rows[0]
            cents = to_cents(str(r.amount).strip(), str(r.currency), reporting)
            sale, refund = (cents, 0) if r.event_type == "sale" else (0, cents)
            out.append(SalesRow._make((partition, order_id, r.customer_id, r.currency, sale, refund,
                                       sale - refund, 1, r.created_at_utc)))  # fmt: skip
            continue
        rows.sort(key=lambda r: (r.event_type != "sale", *_time_key(r.created_at_utc), r.row_id))
        gross = refunds = 0
        for r in rows:
            cents = to_cents(str(r.amount).strip(), str(r.currency), reporting)
            if r.event_type == "sale":
                gross += cents
            else:
                refunds += cents
        times = [r.created_at_utc for r in rows if r.created_at_utc is not None]
        out.append(
            SalesRow._make(
                (
                    partition,
                    order_id,
                    next((r.customer_id for r in rows if r.customer_id is not None), None),
                    next((r.currency for r in rows if r.currency is not None), None),
                    gross,
                    refunds,
                    gross - refunds,
                    len(rows),
                    min(times) if times else None,
                )
            )
        )
    return out
