"""Cleaning rules: every reject reason, dedupe, refunds, currency, determinism."""

from __future__ import annotations

import datetime as dt
import io
import json

import pandas as pd
import pytest

from onceflow.sales.checksum import rows_checksum
from onceflow.sales.clean import REJECT_REASONS, RejectRatioExceeded, clean_orders
from onceflow.sales.generator import GeneratorConfig, generate_day
from onceflow.sales.partition_store import frame_records
from onceflow.sales.partitions import day_bounds_utc
from onceflow.sales.schema import ORDER_COLUMNS, SALES_COLUMNS

DAY = dt.date(2024, 5, 6)
T0 = dt.datetime(2024, 5, 6, 8, 0)


def event(row_id: int, **overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "row_id": row_id,
        "order_id": f"O{row_id}",
        "event_type": "sale",
        "refund_id": None,
        "customer_id": "C1",
        "created_at_utc": T0 + dt.timedelta(minutes=row_id),
        "ingested_at_utc": T0 + dt.timedelta(minutes=row_id, seconds=5),
        "amount": "10.00",
        "currency": "EUR",
    }
    row.update(overrides)
    return row


def frame(*rows: dict[str, object]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(ORDER_COLUMNS))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"order_id": None}, "missing_order_id"),
        ({"order_id": "   "}, "missing_order_id"),
        ({"event_type": "chargeback"}, "unknown_event_type"),
        ({"event_type": None}, "unknown_event_type"),
        ({"event_type": "refund", "refund_id": None}, "missing_refund_id"),
        ({"amount": "12,50 EUR"}, "bad_amount"),
        ({"amount": None}, "bad_amount"),
        ({"amount": "1e3"}, "bad_amount"),
        ({"amount": "10.001"}, "sub_cent_amount"),
        ({"amount": "10.0250"}, "sub_cent_amount"),  # numeric(14,4): a fraction of a cent
        ({"amount": "10.5e1"}, "bad_amount"),
        ({"amount": "-5.00"}, "non_positive_amount"),
        ({"amount": "0.00"}, "non_positive_amount"),
        ({"currency": "XXX"}, "unknown_currency"),
        ({"currency": None}, "unknown_currency"),
    ],
)
def test_each_malformed_row_is_rejected_with_its_reason(overrides: dict[str, object], reason: str) -> None:
    result = clean_orders(frame(event(1), event(2, **overrides)), partition=DAY)
    assert result.rejects["reason"].tolist() == [reason]
    assert result.rejects["source_row_id"].tolist() == [2]
    assert result.rows["order_id"].tolist() == ["O1"]
    # The raw row is kept so nothing is lost.
    assert '"row_id": 2' in result.rejects["raw"].iloc[0]


def test_every_reason_is_covered_by_the_cases_above() -> None:
    assert set(REJECT_REASONS) == {
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
    }


@pytest.mark.parametrize("amount", ["14.0200", "14.020000", "14.02"])
def test_amounts_with_more_places_load_when_nothing_is_lost(amount: str) -> None:
    """A numeric(14,4) shop column gives "14.0200": exactly 14.02, loaded, not bad_amount."""
    result = clean_orders(frame(event(1, amount=amount)), partition=DAY)
    assert result.rejects.empty
    assert result.rows["gross_cents"].tolist() == [1402]


def test_the_same_sale_in_another_currency_is_a_conflict_not_a_repeat() -> None:
    """10.00 EUR and 10.00 USD under one order id are different events: the currency is part of
    the event (clean._EVENT_FIELDS), so the older one is rejected, not dropped as a repeat."""
    same = {"order_id": "O1", "created_at_utc": T0}
    result = clean_orders(
        frame(event(1, currency="USD", **same), event(2, currency="EUR", **same)), partition=DAY
    )
    assert result.rows["source_currency"].tolist() == ["EUR"]
    assert result.rejects[["source_row_id", "reason"]].values.tolist() == [[1, "conflicting_duplicate"]]
    assert json.loads(result.rejects["raw"].iloc[0])["currency"] == "USD"
    assert result.duplicates_dropped == 0


def test_exact_duplicates_collapse_to_one_order() -> None:
    repeat = event(2, order_id="O1", created_at_utc=event(1)["created_at_utc"])  # ingested later
    result = clean_orders(frame(event(1), repeat), partition=DAY)
    assert result.rows["order_id"].tolist() == ["O1"]
    assert result.duplicates_dropped == 1
    assert result.rejects.empty


def test_the_latest_ingested_version_of_an_order_wins_and_the_other_is_rejected_not_dropped() -> None:
    late = T0 + dt.timedelta(hours=5)
    result = clean_orders(
        frame(event(1, amount="10.00"), event(2, order_id="O1", amount="12.00", ingested_at_utc=late)),
        partition=DAY,
    )
    assert result.rows["gross_cents"].tolist() == [1200]
    assert result.rejects["reason"].tolist() == ["conflicting_duplicate"]
    assert json.loads(result.rejects["raw"].iloc[0])["amount"] == "10.00"
    assert result.duplicates_dropped == 0


def test_two_different_refunds_under_one_refund_id_keep_one_and_reject_the_other() -> None:
    late = T0 + dt.timedelta(hours=5)
    result = clean_orders(
        frame(
            event(1, order_id="OA", amount="40.00"),
            event(2, order_id="OB", amount="30.00"),
            event(3, order_id="OA", event_type="refund", refund_id="R1", amount="5.00"),
            # the shop reused R1 for a refund of another order: a different event, not a repeat
            event(4, order_id="OB", event_type="refund", refund_id="R1", amount="7.00", ingested_at_utc=late),
            # an exact repeat of the winning refund (only ingested later): latest wins, counted
            event(5, order_id="OB", event_type="refund", refund_id="R1", amount="7.00",
                  created_at_utc=T0 + dt.timedelta(minutes=4), ingested_at_utc=late + dt.timedelta(seconds=1)),
        ),
        partition=DAY,
    )  # fmt: skip
    assert result.rejects[["source_row_id", "reason"]].values.tolist() == [[3, "conflicting_duplicate"]]
    refunds = dict(zip(result.rows["order_id"], result.rows["refund_cents"], strict=True))
    assert refunds == {"OA": 0, "OB": 700}
    assert result.duplicates_dropped == 1
    assert result.reasons() == {"conflicting_duplicate": 1}


def test_the_same_amount_written_differently_is_a_repeat_not_a_conflict() -> None:
    same = {"order_id": "O1", "created_at_utc": T0}
    result = clean_orders(
        frame(event(1, amount="10.0", **same), event(2, amount="10.00", **same)), partition=DAY
    )
    assert result.rejects.empty and result.duplicates_dropped == 1


def test_refunds_are_netted_per_order() -> None:
    result = clean_orders(
        frame(
            event(1, amount="40.00"),
            event(2, order_id="O1", event_type="refund", refund_id="R1", amount="15.50", created_at_utc=T0),
            event(3, order_id="O1", event_type="refund", refund_id="R1", amount="15.50", created_at_utc=T0),
        ),
        partition=DAY,
    )
    row = result.rows.iloc[0]
    assert (row.gross_cents, row.refund_cents, row.net_cents, row.event_count) == (4000, 1550, 2450, 2)


def test_a_refund_of_an_earlier_days_order_stands_on_its_own_day() -> None:
    result = clean_orders(
        frame(event(1, order_id="O-old", event_type="refund", refund_id="R9", amount="5.00")), partition=DAY
    )
    row = result.rows.iloc[0]
    assert (row.order_id, row.gross_cents, row.refund_cents, row.net_cents) == ("O-old", 0, 500, -500)


def test_currencies_are_normalised_with_the_fixed_rates_half_even() -> None:
    result = clean_orders(
        frame(event(1, amount="10.00", currency="USD"), event(2, amount="0.25", currency="SEK")),
        partition=DAY,
    )
    # 10 USD * 0.92 = 9.20 EUR; 0.25 SEK * 0.087 = 0.02175 -> 0.02 (half-even)
    assert result.rows["gross_cents"].tolist() == [920, 2]
    assert result.rows["source_currency"].tolist() == ["USD", "SEK"]


def test_reporting_currency_can_change() -> None:
    result = clean_orders(
        frame(event(1, amount="9.20", currency="EUR")), partition=DAY, reporting_currency="USD"
    )
    assert result.rows["gross_cents"].tolist() == [1000]
    with pytest.raises(ValueError, match="unknown reporting currency"):
        clean_orders(frame(event(1)), partition=DAY, reporting_currency="XYZ")


def test_an_empty_day_gives_an_empty_frame_with_the_right_columns() -> None:
    result = clean_orders(frame(), partition=DAY)
    assert list(result.rows.columns) == list(SALES_COLUMNS)
    assert result.rows.empty and result.rejects.empty
    assert result.reject_ratio == 0.0
    result.check_reject_ratio(0.0)


def test_it_fails_loudly_above_the_reject_ratio() -> None:
    result = clean_orders(frame(event(1), event(2, currency="XXX"), event(3, amount="abc")), partition=DAY)
    result.check_reject_ratio(0.67)
    with pytest.raises(RejectRatioExceeded, match=r"2 of 3 rows rejected .*bad_amount.*unknown_currency"):
        result.check_reject_ratio(0.5)


def _generated_day(day: dt.date) -> pd.DataFrame:
    rows = generate_day(day, GeneratorConfig(seed=3))
    df = pd.DataFrame([r.as_dict() for r in rows])
    df.insert(0, "row_id", range(1, len(df) + 1))
    start, end = (b.replace(tzinfo=None) for b in day_bounds_utc(day, "Europe/Amsterdam"))
    return df[(df.created_at_utc >= start) & (df.created_at_utc < end)].reset_index(drop=True)


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def test_a_rerun_is_byte_identical_and_input_order_does_not_matter() -> None:
    source = _generated_day(DAY)
    first = clean_orders(source, partition=DAY)
    second = clean_orders(source.sample(frac=1.0, random_state=7), partition=DAY)
    assert _parquet_bytes(first.rows) == _parquet_bytes(second.rows)
    assert _parquet_bytes(first.rejects) == _parquet_bytes(second.rejects)
    assert rows_checksum(frame_records(first.rows, SALES_COLUMNS)) == rows_checksum(
        frame_records(second.rows, SALES_COLUMNS)
    )
    assert first.duplicates_dropped > 0 or len(source) < 100


def test_the_column_wise_checksum_equals_the_row_wise_one_even_for_awkward_text() -> None:
    from onceflow.sales.checksum import frame_checksum

    rows = clean_orders(_generated_day(dt.date(2024, 10, 27)), partition=dt.date(2024, 10, 27)).rows.copy()
    rows.loc[0, "customer_id"] = None
    rows.loc[1, "customer_id"] = "a\\b\x1fc\nd"
    assert frame_checksum(rows, SALES_COLUMNS) == rows_checksum(frame_records(rows, SALES_COLUMNS))
    assert frame_checksum(rows.iloc[0:0], SALES_COLUMNS) == rows_checksum([])
    assert frame_checksum(rows, SALES_COLUMNS) != frame_checksum(
        pd.concat([rows, rows.iloc[:1]]), SALES_COLUMNS
    )


LONG = "O" + "7" * 64  # 65 characters: one more than the warehouse's id columns hold


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"order_id": "O\x002"}, "nul_byte"),
        ({"customer_id": "C\x00"}, "nul_byte"),
        ({"event_type": "refund", "refund_id": "R\x00"}, "nul_byte"),
        ({"customer_id": "C\udcff"}, "invalid_text"),  # a byte that is not UTF-8, as the shop read it
        ({"order_id": "O\udc80"}, "invalid_text"),
        ({"order_id": LONG}, "value_too_long"),
        ({"customer_id": "C" * 65}, "value_too_long"),
        ({"event_type": "refund", "refund_id": None, "order_id": LONG}, "value_too_long"),
    ],
)
def test_values_the_warehouse_cannot_store_are_rejected_not_loaded(
    overrides: dict[str, object], reason: str
) -> None:
    """PostgreSQL refuses NUL in text, text that is not UTF-8 and ids over varchar(64); SQLite
    stores all three. Loading them would fail the load on every retry and block the day."""
    rows = [event(1), event(2, **overrides)]
    # Text as plain objects, as the extract hands it over: pandas' string dtype refuses surrogates.
    text = {"order_id", "event_type", "refund_id", "customer_id", "amount", "currency"}
    source = pd.DataFrame(
        {c: pd.Series([r[c] for r in rows], dtype=object if c in text else None) for c in ORDER_COLUMNS}
    )
    result = clean_orders(source, partition=DAY)
    assert result.rejects["reason"].tolist() == [reason]
    assert result.rows["order_id"].tolist() == ["O1"]
    raw = result.rejects["raw"].iloc[0]
    raw.encode("utf-8")  # storable: NUL and stray bytes appear escaped, the full value kept
    assert "\x00" not in raw
    assert json.loads(raw) == {
        k: (v.isoformat(sep=" ", timespec="microseconds") if isinstance(v, dt.datetime) else v)
        for k, v in event(2, **overrides).items()
    }
    stored_id = result.rejects["order_id"].iloc[0]
    # The reject's order_id column must be storable too (escaped, cut to the width).
    assert stored_id is None or (len(stored_id) <= 64 and "\x00" not in stored_id)
    assert stored_id is None or len(stored_id.encode("utf-8")) >= len(stored_id)  # no surrogates


def test_an_id_of_exactly_the_column_width_is_kept() -> None:
    result = clean_orders(frame(event(1, order_id="O" * 64, customer_id="C" * 64)), partition=DAY)
    assert result.rejects.empty
    assert result.rows["order_id"].tolist() == ["O" * 64]


def test_the_largest_amount_accepted_fits_the_cents_columns() -> None:
    """12 integer digits in the dearest currency stay far below bigint; a 13th digit is bad_amount."""
    result = clean_orders(
        frame(event(1, amount="999999999999.99", currency="GBP"), event(2, amount="1" * 13)), partition=DAY
    )
    assert result.rejects["reason"].tolist() == ["bad_amount"]
    assert 0 < int(result.rows["gross_cents"].iloc[0]) < 2**63 - 1
