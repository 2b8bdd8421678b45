"""The load streams the staged rows: batch by batch into the warehouse and the checksum, never the
whole day in one frame; the result equals the one-frame load (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from onceflow.sales import bulk_load, partition_store, staging
from onceflow.sales.checksum import frame_checksum
from onceflow.sales.clean import CleanResult, normalise_sales_frame
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.schema import REJECT_COLUMNS, SALES_COLUMNS

DAY = dt.date(2024, 10, 27)
ROWS = 2_500


def day_rows(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    gross = rng.integers(100, 90_000, n)
    return normalise_sales_frame(
        pd.DataFrame(
            {
                "partition_date": [DAY] * n, "order_id": [f"O-{i:07d}" for i in range(n)],
                "customer_id": [None if i % 20 == 0 else "" if i % 20 == 10 else f"C{i % 997}" for i in range(n)],
                "source_currency": rng.choice(["EUR", "USD"], n), "gross_cents": gross, "refund_cents": gross * 0,
                "net_cents": gross, "event_count": np.ones(n, dtype="int64"),
                "first_event_utc": np.datetime64("2024-10-26T22:00:00", "us")
                + rng.integers(0, 25 * 3600 * 10**6, n).astype("timedelta64[us]"),
            }
        )
    )  # fmt: skip


def test_a_staged_day_streams_in_batches_and_loads_what_one_frame_would(
    sales_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = day_rows(ROWS)
    rejects = pd.DataFrame({c: [] for c in REJECT_COLUMNS}).astype({"source_row_id": "int64"})
    result = CleanResult(rows=rows, rejects=rejects, source_rows=ROWS, duplicates_dropped=3)
    staging.write_clean(tmp_path, result, partition=DAY, processing_version="v")

    batch_sizes: list[int] = []
    real_insert = bulk_load.insert_rows

    def counting_insert(conn: object, table: object, batch: pd.DataFrame, method: str) -> None:
        batch_sizes.append(len(batch))
        real_insert(conn, table, batch, method)  # type: ignore[arg-type]

    monkeypatch.setattr(partition_store, "insert_rows", counting_insert)
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    with staging.open_clean(tmp_path) as staged:
        assert staged.row_count == ROWS and staged.duplicates_dropped == 3
        audit = store.overwrite(
            lease, staged.row_batches(batch_rows=1_000), staged.rejects, processing_version="v",
            duplicate_count=staged.duplicates_dropped,
        )  # fmt: skip
    assert batch_sizes == [1_000, 1_000, 500]  # never the day in one frame
    assert (audit.row_count, audit.duplicate_count) == (ROWS, 3)
    assert audit.checksum == frame_checksum(rows, SALES_COLUMNS) == store.partition_checksum(DAY)


def test_a_row_of_another_day_mid_stream_rolls_the_whole_load_back(sales_db_url: str) -> None:
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    first = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=1), day_rows(10), processing_version="v"
    )
    stray = day_rows(5).assign(partition_date=DAY + dt.timedelta(days=1))
    with pytest.raises(ValueError, match="rows for partitions \\['2024-10-28'\\]"):
        store.overwrite(
            store.acquire_lease(DAY, run_id="r", try_number=2),
            iter([day_rows(7), stray]),
            processing_version="v",
        )
    assert store.audit(DAY) == first and len(store.partition_rows(DAY)) == 10  # the old partition, whole


@pytest.mark.postgres
def test_the_backend_terminated_between_two_streamed_copies_leaves_the_old_partition(
    postgres_url: str,
) -> None:
    """pg_terminate_backend after the first batch's COPY: the old rows and audit stay, the retry loads."""
    import sqlalchemy as sa

    engine = make_engine(postgres_url)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    old = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=1), day_rows(10), processing_version="v"
    )
    new = day_rows(2_500)
    admin = sa.create_engine(postgres_url)

    def batches_then_terminate() -> object:
        yield new.iloc[:1_000]
        with admin.connect() as conn:  # the loader is idle in its transaction, its first COPY sent
            killed = conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
                )
            ).all()
        assert killed == [(True,)]
        yield new.iloc[1_000:]

    import psycopg2

    # the raw COPY cursor sees the closed connection (psycopg2's error, or SQLAlchemy's on rollback)
    with pytest.raises((sa.exc.DBAPIError, psycopg2.Error), match="closed"):
        store.overwrite(
            store.acquire_lease(DAY, run_id="r", try_number=2),
            batches_then_terminate(),
            processing_version="v",
        )
    engine.dispose()  # the pool's dead connection
    assert store.audit(DAY) == old and len(store.partition_rows(DAY)) == 10
    retried = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=3), iter([new]), processing_version="v"
    )
    assert retried.row_count == 2_500 and store.partition_checksum(DAY) == retried.checksum
    admin.dispose()
