"""Cleaning one day of shop events into one row per order (pandas, deterministic): the reference.

The clean task runs the same rules without pandas (:mod:`onceflow.sales.clean_rules`, bucket by
bucket in :mod:`onceflow.sales.clean_stream`); the tests compare it with :func:`clean_orders`.

Rules, in order:

1. **Reject** malformed rows into ``rejects`` with one reason each (first matching reason wins):
   ``nul_byte``, ``invalid_text``, ``value_too_long`` (values the warehouse cannot store: a
   SQLite shop holds them, PostgreSQL refuses them, and a load that fails on every retry would
   block the day), ``missing_order_id``, ``unknown_event_type``, ``missing_refund_id``,
   ``bad_amount``, ``sub_cent_amount`` (digits beyond cents that are not zero: ``14.0200`` from a
   ``numeric(14,4)`` column is 14.02, ``14.0250`` would lose a fraction of a cent),
   ``non_positive_amount``, ``unknown_currency``. Nothing is dropped silently:
   each reject keeps the whole raw row as ASCII JSON (NUL as ``\\u0000``, a byte that is not
   UTF-8, read as U+DC80 + byte, as ``\\udcXX``).
2. **Dedupe**: a sale is identified by its order id, a refund by its refund id; of several rows
   under one key the latest ingested one wins (ties: the higher source ``row_id``). A row that
   repeats the winner as an event (same order, refund id, customer, event time and amount in the
   same currency; only ``row_id`` and ``ingested_at_utc`` differ) is an exact repeat, dropped and
   counted (``duplicates_dropped``). A row that differs from the winner as an event (a refund id
   reused on another order, a second sale under one order id, a corrected amount) is not dropped:
   it goes to ``rejects`` as ``conflicting_duplicate`` with its raw row.
3. **Normalise currency** into the reporting currency with a fixed rate table, rounding each event
   half-even to cents.
4. **Net refunds** per order within the day: ``net = gross - refunds``. A refund of an order sold
   on an earlier day appears on the refund's own day with ``gross_cents = 0``.

Only the source rows and the partition day feed the output: no clock, no randomness, a stable
sort; a re-run on the same input is byte-identical.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from decimal import Decimal
from typing import TYPE_CHECKING

import pandas as pd

from onceflow.sales import clean_rules as rules
from onceflow.sales.clean_rules import PROCESSING_VERSION, RATES_TO_EUR, REJECT_REASONS
from onceflow.sales.schema import ID_LENGTH, ORDER_COLUMNS, REJECT_COLUMNS, SALES_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PROCESSING_VERSION", "RATES_TO_EUR", "REJECT_REASONS", "CleanResult", "clean_orders"]

# The shared constants and per-value helpers (clean_rules holds the rules the clean task runs).
_EVENT_FIELDS = rules.EVENT_FIELDS
_AMOUNT_RE = rules.AMOUNT_RE
_CENTS_EXACT_RE = rules.CENTS_EXACT_RE
_TEXT_COLUMNS = rules.TEXT_COLUMNS
_STORED_ID_COLUMNS = rules.STORED_ID_COLUMNS
_SURROGATE = rules.SURROGATE
_CENT = rules.CENT
_raw_json = rules.raw_json
_storable_id = rules.storable_id
_to_cents = rules.to_cents
_NUL = re.compile("\x00")


class RejectRatioExceeded(ValueError):
    """More rows were rejected than the configured ratio allows: the load must not happen."""


@dataclasses.dataclass(frozen=True)
class CleanResult:
    """Output of :func:`clean_orders`.

    :param rows: one row per order, columns :data:`SALES_COLUMNS`, sorted by order id.
    :param rejects: rejected source rows, columns :data:`REJECT_COLUMNS`, sorted by row id.
    :param source_rows: number of source rows read.
    :param duplicates_dropped: valid rows dropped as duplicates of a kept event.
    """

    rows: pd.DataFrame
    rejects: pd.DataFrame
    source_rows: int
    duplicates_dropped: int

    @property
    def reject_ratio(self) -> float:
        """The share of source rows rejected (0 for an empty day)."""
        return len(self.rejects) / self.source_rows if self.source_rows else 0.0

    def reasons(self) -> dict[str, int]:
        """Reject counts by reason, sorted by reason."""
        return {str(k): int(v) for k, v in sorted(self.rejects["reason"].value_counts().items())}

    def check_reject_ratio(self, max_ratio: float) -> None:
        """Raise :class:`RejectRatioExceeded` when the reject ratio is above ``max_ratio``."""
        if self.reject_ratio > max_ratio:
            raise RejectRatioExceeded(
                f"{len(self.rejects)} of {self.source_rows} rows rejected "
                f"({self.reject_ratio:.1%} > allowed {max_ratio:.1%}): {self.reasons()}"
            )


def _blank(series: pd.Series) -> pd.Series:
    return series.isna() | (series.astype("string").str.strip() == "")


def _reject_reasons(df: pd.DataFrame) -> pd.Series:
    reasons = pd.Series([None] * len(df), index=df.index, dtype=object)

    def mark(mask: pd.Series, reason: str) -> None:
        reasons[mask.fillna(True).astype(bool) & reasons.isna()] = reason

    def any_text(pattern: re.Pattern[str]) -> pd.Series:
        # Plain Python per value: pandas' string dtype cannot even hold a lone surrogate. A column
        # whose values joined hold no match (the pattern is one character) has none in any value.
        found = []
        for c in _TEXT_COLUMNS:
            try:
                joined = "".join(df[c].dropna().tolist())
            except TypeError:  # a value that is neither text nor missing
                joined = "".join(v for v in df[c].tolist() if isinstance(v, str))
            if pattern.search(joined) is None:
                found.append(pd.Series(False, index=df.index))
            else:
                found.append(df[c].map(lambda v: isinstance(v, str) and pattern.search(v) is not None))
        return pd.concat(found, axis=1).any(axis=1).astype(bool)

    mark(any_text(_NUL), "nul_byte")
    invalid = any_text(_SURROGATE)
    mark(invalid, "invalid_text")
    if invalid.any():  # the rules below run on text; these rows are rejected already
        df = df.copy()
        for c in _TEXT_COLUMNS:
            df[c] = df[c].map(
                lambda v: v.encode("utf-8", "backslashreplace").decode() if isinstance(v, str) else v
            )
    event = df["event_type"].astype("string")
    amount = df["amount"].astype("string").str.strip()
    too_long = [df[c].astype("string").str.len().fillna(0) > ID_LENGTH for c in _STORED_ID_COLUMNS]
    mark(pd.concat(too_long, axis=1).any(axis=1), "value_too_long")
    mark(_blank(df["order_id"]), "missing_order_id")
    mark(~event.isin(["sale", "refund"]), "unknown_event_type")
    mark((event == "refund") & _blank(df["refund_id"]), "missing_refund_id")
    well_formed = amount.str.fullmatch(_AMOUNT_RE.pattern).fillna(False).astype(bool)
    mark(~well_formed, "bad_amount")
    mark(~amount.str.fullmatch(_CENTS_EXACT_RE.pattern).fillna(False).astype(bool), "sub_cent_amount")
    mark(
        amount.str.startswith("-").fillna(False) | amount.str.fullmatch(r"-?0+(\.0+)?").fillna(False),
        "non_positive_amount",
    )
    mark(~df["currency"].astype("string").isin(list(RATES_TO_EUR)), "unknown_currency")
    return reasons


def clean_orders(
    source: pd.DataFrame,
    *,
    partition: dt.date,
    reporting_currency: str = "EUR",
) -> CleanResult:
    """Clean one partition's source events (columns of the shop's ``orders`` table).

    :param source: the events whose event time lies in the partition's interval.
    :param partition: the business-local day, written into every output row.
    :param reporting_currency: currency of the output amounts; must be in :data:`RATES_TO_EUR`.
    """
    if reporting_currency not in RATES_TO_EUR:
        raise ValueError(f"unknown reporting currency {reporting_currency!r}; known: {sorted(RATES_TO_EUR)}")
    df = source.loc[:, list(ORDER_COLUMNS)].sort_values("row_id", kind="stable").reset_index(drop=True)
    df = df.astype({"row_id": "int64"})
    reasons = _reject_reasons(df)
    rejected = df[reasons.notna()]
    rejects = pd.DataFrame(
        {
            "source_row_id": rejected["row_id"].astype("int64"),
            "order_id": [_storable_id(v) for v in rejected["order_id"]],
            "reason": reasons[reasons.notna()].astype(object),
            "raw": [_raw_json(r) for r in rejected.to_dict("records")],
        },
        columns=list(REJECT_COLUMNS),
    ).reset_index(drop=True)

    valid = df[reasons.isna()].copy()
    deduped, conflicting, duplicates = _dedupe(valid)
    if len(conflicting):
        more = pd.DataFrame(
            {
                "source_row_id": conflicting["row_id"].astype("int64"),
                "order_id": [_storable_id(v) for v in conflicting["order_id"]],
                "reason": "conflicting_duplicate",
                "raw": [_raw_json(r) for r in conflicting.to_dict("records")],
            },
            columns=list(REJECT_COLUMNS),
        )
        rejects = pd.concat([rejects, more], ignore_index=True)
        rejects = rejects.sort_values("source_row_id", kind="stable").reset_index(drop=True)

    rows = _net_per_order(deduped, partition, reporting_currency)
    return CleanResult(rows=rows, rejects=rejects, source_rows=len(df), duplicates_dropped=duplicates)


def _dedupe(valid: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """``(kept events, rows conflicting with a kept event, exact repeats dropped)``."""
    valid = valid.copy()
    valid["event_key"] = valid["order_id"].where(valid["event_type"] == "sale", valid["refund_id"])
    valid["event_key"] = valid["event_type"].astype(str) + ":" + valid["event_key"].astype(str)
    valid["_event"] = _event_fingerprints(valid)
    valid = valid.sort_values(["event_key", "ingested_at_utc", "row_id"], kind="stable")
    is_winner = ~valid.duplicated("event_key", keep="last")
    winners = valid[is_winner]
    winner_event = valid["event_key"].map(
        pd.Series(winners["_event"].values, index=winners["event_key"].values)
    )
    differs = ~is_winner & (valid["_event"] != winner_event)
    conflicting = valid[differs].sort_values("row_id", kind="stable")
    repeats = int((~is_winner & ~differs).sum())
    return winners.drop(columns=["_event"]), conflicting.drop(columns=["event_key", "_event"]), repeats


def _event_fingerprints(valid: pd.DataFrame) -> list[str]:
    """Each row as an event, in text: the quantized amount and ``_EVENT_FIELDS`` (:func:`_field_values`),
    joined by NUL. Equal amounts written differently ("10.0", "10.00") are one event.

    Two rows get one fingerprint only when they are one event: no value of a valid row holds NUL
    (``nul_byte`` rejects it), so the separator cannot come from a value (``\\x1f``, the separator
    before v5, could: customer ``"R\\x1fX"`` of order ``"A"`` read as order ``"A\\x1fR"`` of customer
    ``"X"``), and a NULL is not the text ``"None"``."""
    amounts = [str(Decimal(str(a).strip()).quantize(_CENT)) for a in valid["amount"]]
    columns = [_field_values(valid[name]) for name in _EVENT_FIELDS]
    return ["\x00".join(parts) for parts in zip(amounts, *columns, strict=True)]


def _field_values(series: pd.Series) -> list[str]:
    """One fingerprint field per value: its :func:`_str_values` text; in a column with a missing
    value, ``"="`` and the text, or ``"-"`` for a missing one (before v5 a NULL was ``str(None)``,
    the same as the text ``"None"``). Fingerprints are compared within one frame, where each column
    has one form, so a column without NULLs (most of them) keeps its plain text."""
    missing = series.isna()
    if not missing.any():
        return _str_values(series)
    return ["-" if m else "=" + t for t, m in zip(_str_values(series), missing.tolist(), strict=True)]


def _str_values(series: pd.Series) -> list[str]:
    """``[str(v) for v in series.tolist()]``, with a naive ``datetime64`` column formatted by Arrow
    (``str()`` of a ``Timestamp``: ISO with a space, the microseconds only when not zero)."""
    if pd.api.types.is_datetime64_dtype(series.dtype) and series.notna().all() and len(series):
        import pyarrow as pa
        import pyarrow.compute as pc

        text = pa.array(series.astype("datetime64[us]")).cast(pa.string())  # "... HH:MM:SS.ffffff"
        if series.dtype == "datetime64[us]" or (series.dt.nanosecond == 0).all():
            return pc.replace_substring_regex(text, r"\.000000$", "").to_pylist()
    return [str(v) for v in series.tolist()]


def _net_per_order(events: pd.DataFrame, partition: dt.date, reporting: str) -> pd.DataFrame:
    if events.empty:
        return empty_sales_frame()
    ev = events.copy()
    ev["cents"] = [
        _to_cents(str(a).strip(), str(c), reporting)
        for a, c in zip(ev["amount"], ev["currency"], strict=True)
    ]
    is_sale = ev["event_type"] == "sale"
    ev["sale_cents"] = ev["cents"].where(is_sale, 0)
    ev["refund_cents"] = ev["cents"].where(~is_sale, 0)
    ev["rank"] = (~is_sale).astype(int)  # sales first: they name the customer and currency
    ev = ev.sort_values(["order_id", "rank", "created_at_utc", "row_id"], kind="stable")
    grouped = ev.groupby("order_id", sort=True)
    out = pd.DataFrame(
        {
            "customer_id": grouped["customer_id"].first(),
            "source_currency": grouped["currency"].first(),
            "gross_cents": grouped["sale_cents"].sum(),
            "refund_cents": grouped["refund_cents"].sum(),
            "event_count": grouped["row_id"].size(),
            "first_event_utc": grouped["created_at_utc"].min(),
        }
    ).reset_index()
    out["net_cents"] = out["gross_cents"] - out["refund_cents"]
    out["partition_date"] = partition
    return normalise_sales_frame(out)


def empty_sales_frame() -> pd.DataFrame:
    """A sales frame with no rows and the right columns."""
    return normalise_sales_frame(pd.DataFrame({c: [] for c in SALES_COLUMNS}))


def sales_rows_frame(rows: Sequence[Sequence[object]]) -> pd.DataFrame:
    """Sales rows as plain Python values (fields in :data:`SALES_COLUMNS` order: a day staged as
    text) as a normalised sales frame."""
    if not rows:
        return empty_sales_frame()
    return normalise_sales_frame(
        pd.DataFrame.from_records(list(map(tuple, rows)), columns=list(SALES_COLUMNS))
    )


def normalise_sales_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes of the sales table, so every path yields identical frames."""
    out = df.loc[:, list(SALES_COLUMNS)].copy()
    for col in ("gross_cents", "refund_cents", "net_cents", "event_count"):
        out[col] = out[col].astype("int64")
    for col in ("order_id", "customer_id", "source_currency"):
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    out["first_event_utc"] = pd.to_datetime(out["first_event_utc"]).astype("datetime64[us]")
    out["partition_date"] = [
        d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d)[:10]) for d in out["partition_date"]
    ]
    out["partition_date"] = out["partition_date"].astype(object)
    return out.sort_values("order_id", kind="stable").reset_index(drop=True)
