"""Randomised crowded days through clean and load (issue 29 review): what the warehouse holds after
the bounded-memory clean (``staging.clean_extract``, buckets of a few rows) and the streamed load
(``open_clean`` → Arrow batches, or Python rows of a day staged as text, of a few rows → one COPY
formatted in a second thread, the checksum spilled to sorted runs) equals the whole-day ``clean_orders`` of the same rows: the rows read back
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
from onceflow.sales.schema import ORDER_COLUMNS, REJECT_COLUMNS, SALES_COLUMNS
from onceflow.sales.text_staging import TEXT_ROWS_ENV
from onceflow.testing.sales_crowded import random_day
from onceflow.testing.sales_fixtures import order_columns

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
            if isinstance(batch, list):  # a day staged as text: Python rows
                batch = [(DAY + dt.timedelta(days=1), *row[1:]) for row in batch]
            else:
                dates = pa.array([DAY + dt.timedelta(days=1)] * batch.num_rows, pa.date32())
                batch = batch.set_column(0, "partition_date", dates)
        yield batch


# SQLite once; PostgreSQL through both drivers (each formats and sends the COPY its own way).
@pytest.mark.parametrize(
    ("onceflow_sales_db_url", "driver"),
    [
        ("sqlite", None),
        pytest.param("postgres", "psycopg2", marks=pytest.mark.postgres),
        pytest.param("postgres", "psycopg", marks=pytest.mark.postgres),
    ],
    indirect=["onceflow_sales_db_url"],
)
def test_random_days_load_what_the_whole_day_clean_gives(
    onceflow_sales_db_url: str, driver: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = onceflow_sales_db_url
    if driver is not None:
        url = url.replace("postgresql+psycopg2://", f"postgresql+{driver}://")
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
            # Text or parquet staging (issue 27): the extract as the shop query's batch, or a frame.
            monkeypatch.setenv(TEXT_ROWS_ENV, rng.choice(["0", "10000"]))
            if rng.random() < 0.5:
                staging.write_extract_stream(folder, [order_columns(source)])
            else:
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
                        failing(staged.load_batches(batch_rows), rng.randrange(-(-len(whole.rows) // batch_rows)), how),
                        staged.rejects, processing_version="v",
                    )  # fmt: skip
                assert (store.audit(DAY), store.partition_rows(DAY), store.partition_rejects(DAY)) == loaded

            with staging.open_clean(folder) as staged:
                audit = store.overwrite(
                    store.acquire_lease(DAY, run_id=f"r{seed}", try_number=2), staged.load_batches(batch_rows),
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


SHOP_ORDERS = """
CREATE TABLE orders (
    row_id bigint PRIMARY KEY,
    order_id text, event_type varchar(16), refund_id text, customer_id text,
    created_at_utc timestamptz NOT NULL, ingested_at_utc timestamptz NOT NULL,
    amount text, currency text
)"""


@pytest.mark.postgres
def test_random_days_extract_from_a_postgres_shop_in_amsterdam_unchanged(
    postgres_url_factory: Any, tmp_path: Path
) -> None:
    """A PostgreSQL shop with ``timestamptz`` event times whose sessions start in Europe/Amsterdam:
    the extract (server-side cursor in batches of a few rows) stages each crowded day's rows as the
    shop holds them, the rows one microsecond before the day and at its end left out."""
    import sqlalchemy as sa

    from onceflow.sales.engine import make_source_engine
    from onceflow.sales.partitions import day_bounds_utc
    from onceflow.sales.shop_query import stream_interval

    shop = postgres_url_factory("shop")
    writer = make_engine(shop)
    start, end = day_bounds_utc(DAY, "Europe/Amsterdam")
    with writer.begin() as conn:
        conn.exec_driver_sql(SHOP_ORDERS)
        conn.exec_driver_sql(
            f"ALTER DATABASE \"{sa.engine.make_url(shop).database}\" SET timezone TO 'Europe/Amsterdam'"
        )
    engine = make_source_engine(shop)
    try:
        for seed in range(8):
            rng = random.Random(40_000 + seed)
            source = random_day(seed).sort_values("row_id", kind="stable").reset_index(drop=True)
            records = [{str(k): v for k, v in r.items()} for r in source.to_dict("records")]
            outside = [
                {**records[0], "row_id": 10**6, "created_at_utc": start.replace(tzinfo=None) - dt.timedelta(microseconds=1)},
                {**records[0], "row_id": 10**6 + 1, "created_at_utc": end.replace(tzinfo=None)},
            ]  # fmt: skip
            with writer.begin() as conn:
                conn.exec_driver_sql("TRUNCATE orders")
                conn.execute(
                    sa.text(
                        "INSERT INTO orders VALUES (:row_id, :order_id, :event_type, :refund_id, :customer_id,"
                        " CAST(:created_at_utc AS timestamp) AT TIME ZONE 'UTC',"
                        " CAST(:ingested_at_utc AS timestamp) AT TIME ZONE 'UTC', :amount, :currency)"
                    ),
                    [{**r, "created_at_utc": str(r["created_at_utc"]), "ingested_at_utc": str(r["ingested_at_utc"])}
                     for r in records + outside],
                )  # fmt: skip
            folder = tmp_path / str(seed)
            with stream_interval(engine, start, end, batch_rows=rng.choice([1, 3, 50_000])) as (
                mark,
                batches,
            ):
                staging.write_extract_stream(folder, batches, source_watermark_utc=mark)
            staged = staging.read_extract(folder).frame
            for column in ORDER_COLUMNS:
                assert staged[column].tolist() == source[column].tolist(), (seed, column)
    finally:
        engine.dispose()
        writer.dispose()
