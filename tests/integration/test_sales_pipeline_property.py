"""Randomised crowded days through clean and load (issue 29 review): what the warehouse holds after
the bounded-memory clean (``staging.clean_extract``, buckets of a few rows) and the streamed load
(``open_clean`` → Arrow batches of a few rows → one COPY formatted in a second thread, the checksum
spilled to sorted runs) equals the whole-day ``clean_orders`` of the same rows: the rows read back
with plain SQL, the rejects with their reasons, the audit's counts, and a checksum equal to the one
recomputed from the rows read back. Between two days, a load whose rows fail part way (in the
formatting thread, or a row of another partition) leaves the previous day's partition and audit.

Ids reach the warehouse holding tabs, newlines, carriage returns, backslashes, ``\\N``, unit
separators, the text ``None`` and non-ASCII text (``onceflow.testing.sales_crowded``)."""

from __future__ import annotations

import datetime as dt
import random
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from onceflow.sales import checksum, clean_stream, staging
from onceflow.sales.checksum import frame_checksum
from onceflow.sales.clean import clean_orders
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore, frame_records
from onceflow.sales.schema import REJECT_COLUMNS, SALES_COLUMNS
from onceflow.testing.sales_crowded import random_day

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DAY = dt.date(2024, 10, 27)
SEEDS = range(12)


class FormattingFailed(RuntimeError):
    """Raised from inside the rows the load formats (its second thread)."""


def failing(batches: Iterator[Any], at: int, how: str) -> Iterator[Any]:
    """``batches`` until the ``at``-th, then an error (``raise``) or a row of another day (``day``)."""
    for i, batch in enumerate(batches):
        if i == at:
            if how == "raise":
                raise FormattingFailed(f"batch {i}")
            dates = pa.array([DAY + dt.timedelta(days=1)] * batch.num_rows, pa.date32())
            batch = batch.set_column(0, "partition_date", dates)
        yield batch


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_random_days_load_what_the_whole_day_clean_gives(
    sales_db_url: str, driver: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sales_db_url.startswith("sqlite"):
        if driver != "psycopg2":
            pytest.skip("one SQLite run is enough")
        url = sales_db_url
    else:
        url = sales_db_url.replace("postgresql+psycopg2://", f"postgresql+{driver}://")
    store = PartitionStore(make_engine(url), "daily_sales")
    store.create_schema()
    loaded: tuple[Any, ...] | None = None  # the last committed day: (audit, rows, rejects)
    try:
        for seed in SEEDS:
            rng = random.Random(20_000 + seed)
            monkeypatch.setattr(checksum, "SPILL_ROWS", rng.choice([1, 3, 10, 1_000_000]))
            monkeypatch.setattr(checksum, "_MERGE_ROWS", rng.choice([1, 2, 65_536]))
            monkeypatch.setattr(clean_stream, "FLUSH_ROWS", rng.choice([1, 5, 200_000]))
            monkeypatch.setattr(staging, "EXTRACT_READ_ROWS", rng.choice([1, 4, 50_000]))
            source = random_day(seed)
            folder = tmp_path / str(seed)
            staging.write_extract(folder, source)
            whole = clean_orders(staging.read_extract(folder).frame, partition=DAY)
            staging.clean_extract(
                folder, partition=DAY, processing_version="v", bucket_rows=rng.choice([1, 3, 50])
            )
            batch_rows = rng.choice([1, 2, 7, 50_000])

            if loaded is not None and len(whole.rows):  # a load failing part way changes nothing
                how = rng.choice(["raise", "day"])
                with staging.open_clean(folder) as staged, pytest.raises((FormattingFailed, ValueError)):
                    store.overwrite(
                        store.acquire_lease(DAY, run_id=f"r{seed}", try_number=1),
                        failing(staged.arrow_batches(batch_rows), rng.randrange(-(-len(whole.rows) // batch_rows)), how),
                        staged.rejects, processing_version="v",
                    )  # fmt: skip
                assert (store.audit(DAY), store.partition_rows(DAY), store.partition_rejects(DAY)) == loaded

            with staging.open_clean(folder) as staged:
                audit = store.overwrite(
                    store.acquire_lease(DAY, run_id=f"r{seed}", try_number=2), staged.arrow_batches(batch_rows),
                    staged.rejects, processing_version="v", duplicate_count=staged.duplicates_dropped,
                )  # fmt: skip
            rows, rejects = store.partition_rows(DAY), store.partition_rejects(DAY)
            expected_rows = frame_records(whole.rows, SALES_COLUMNS)
            assert sorted(rows, key=lambda r: r[1]) == expected_rows, seed  # the database's collation aside
            assert [tuple(r.values()) for r in rejects] == frame_records(whole.rejects, REJECT_COLUMNS), seed
            assert (audit.row_count, audit.reject_count, audit.duplicate_count) == (
                len(whole.rows), len(whole.rejects), whole.duplicates_dropped,
            ), seed  # fmt: skip
            assert (
                audit.checksum == store.partition_checksum(DAY) == frame_checksum(whole.rows, SALES_COLUMNS)
            ), seed
            loaded = (store.audit(DAY), rows, rejects)
    finally:
        store.engine.dispose()
