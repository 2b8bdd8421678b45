"""The load's column-wise work equals the per-value definitions: the checksum of Arrow batches
(``RowDigests.add_arrow``, spilled runs merged or not) is ``rows_checksum``'s and the checksum
the code before it stored, and Arrow's COPY text is pandas'. So partitions loaded before keep
verifying against the read-back (``PartitionStore.partition_checksum`` is ``rows_checksum``)."""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from onceflow.sales import checksum
from onceflow.sales.bulk_load import arrow_copy_text, copy_text
from onceflow.sales.checksum import RowDigests, frame_checksum, rows_checksum
from onceflow.sales.clean import normalise_sales_frame
from onceflow.sales.partition_store import frame_records
from onceflow.sales.schema import SALES_COLUMNS, sales_arrow_schema

DAY = dt.date(2024, 10, 27)
#: frame_checksum of golden_rows() by the code before this change (d508f48: pandas, per row).
GOLDEN = "7ab15a4b48fa25870540c65be2c62795ea1512cea77ad35315c2809c3711a394"
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def golden_rows() -> pd.DataFrame:
    times = [dt.datetime(2024, 10, 27, 1, 2, 3), dt.datetime(2024, 10, 27, 1, 2, 3, 4), dt.datetime(5, 1, 1),
             dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1)]  # fmt: skip
    return normalise_sales_frame(
        pd.DataFrame(
            {
                "partition_date": [DAY] * 6, "order_id": ["a\\b", "t\tx", "n\ny", "r\rz", "u\x1fv", "\\N"],
                "customer_id": [None, "", "é€😀", "C\\N", "x\x1f\n", "q"],
                "source_currency": ["EUR", "USD", "GBP", "SEK", "EUR", "EUR"],
                "gross_cents": [1, -2, 3, 2**62, 0, 5], "refund_cents": [0, 7, 0, 0, 0, 0],
                "net_cents": [1, -9, 3, 2**62, 0, 5], "event_count": [1, 2, 3, 1, 1, 1],
                "first_event_utc": pd.array(times, dtype="datetime64[us]"),
            }
        )
    )  # fmt: skip


def arrow(frame: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(frame, schema=sales_arrow_schema(), preserve_index=False)


def arrow_checksum(table: pa.Table, batch_rows: int) -> str:
    digests = RowDigests(SALES_COLUMNS)
    try:
        for batch in table.to_batches(max_chunksize=batch_rows):
            digests.add_arrow(batch)
        return digests.hexdigest()
    finally:
        digests.close()


PIECES = ["", "\\", "\\N", "\t", "\n", "\r", "\x1f", "a", "é", "🙂", " ", ",", '"', "\\.", "N"]


def random_rows(seed: int, n: int) -> pd.DataFrame:
    rng = random.Random(seed)
    text = lambda k: "".join(rng.choice(PIECES) for _ in range(rng.randint(0, k)))  # noqa: E731
    lo = np.datetime64("0001-01-01T00:00:00", "us").astype(np.int64)
    hi = np.datetime64("9999-12-31T23:59:59.999999", "us").astype(np.int64)
    return normalise_sales_frame(
        pd.DataFrame(
            {
                "partition_date": [DAY] * n,
                "order_id": [f"{i}{text(6)}" for i in range(n)],
                "customer_id": [rng.choice([None, "", text(8)]) for _ in range(n)],
                "source_currency": [rng.choice(["EUR", "", "\\N", "\t"]) for _ in range(n)],
                "gross_cents": [rng.randint(-(2**63), 2**63 - 1) for _ in range(n)],
                "refund_cents": [rng.randint(0, 10**6) for _ in range(n)],
                "net_cents": [rng.randint(-(10**6), 10**6) for _ in range(n)],
                "event_count": [rng.randint(1, 9) for _ in range(n)],
                "first_event_utc": np.array([rng.randint(lo, hi) for _ in range(n)]).astype("datetime64[us]"),
            }
        )
    )  # fmt: skip


def test_the_checksum_is_the_one_the_code_before_stored() -> None:
    rows = golden_rows()
    assert rows_checksum(frame_records(rows, SALES_COLUMNS)) == GOLDEN  # the read-back's function
    assert frame_checksum(rows, SALES_COLUMNS) == GOLDEN
    assert arrow_checksum(arrow(rows), 4) == GOLDEN
    assert arrow_checksum(arrow(rows.iloc[:0]), 4) == EMPTY == rows_checksum([])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_arrow_checksum_and_copy_text_equal_the_per_value_ones(seed: int) -> None:
    rows = random_rows(seed, 2_000)
    assert arrow_checksum(arrow(rows), 300) == rows_checksum(frame_records(rows, SALES_COLUMNS))
    assert (
        b"".join(arrow_copy_text(b) or b"" for b in arrow(rows).to_batches(300))
        == copy_text(rows).getvalue().encode()
    )
    assert arrow_checksum(arrow(pd.concat([rows, rows.iloc[:1]])), 300) != arrow_checksum(arrow(rows), 300)


def test_spilled_runs_merge_to_the_same_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests past SPILL_ROWS go to sorted runs in a file; merged a few at a time they give the
    in-memory result, with repeated rows (equal digests across runs) too."""
    rows = pd.concat([random_rows(4, 500), golden_rows(), golden_rows()], ignore_index=True)
    expected = rows_checksum(frame_records(rows, SALES_COLUMNS))
    monkeypatch.setattr(checksum, "SPILL_ROWS", 37)
    monkeypatch.setattr(checksum, "_MERGE_ROWS", 5)
    digests = RowDigests(SALES_COLUMNS)
    for batch in arrow(rows.sample(frac=1.0, random_state=3)).to_batches(max_chunksize=23):
        digests.add_arrow(batch)
    assert len(digests._runs) > 10
    assert digests.hexdigest() == expected == digests.hexdigest()
    digests.close()
    frame = RowDigests(SALES_COLUMNS)
    frame.add(rows)
    assert frame.hexdigest() == expected
    frame.close()
