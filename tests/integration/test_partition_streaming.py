"""The load streams the staged rows: batch by batch into the warehouse and the checksum, never the
whole day in one frame; the result equals the one-frame load (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize("kind", ["arrow", "frames"])
def test_a_staged_day_streams_in_batches_and_loads_what_one_frame_would(
    sales_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    rows = day_rows(ROWS)
    rejects = pd.DataFrame({c: [] for c in REJECT_COLUMNS}).astype({"source_row_id": "int64"})
    result = CleanResult(rows=rows, rejects=rejects, source_rows=ROWS, duplicates_dropped=3)
    staging.write_clean(tmp_path, result, partition=DAY, processing_version="v")

    batch_sizes: list[int] = []
    copies: list[int] = []
    real_copy = bulk_load.copy_chunks

    def counting_copy(conn: object, quoted: str, chunks: Iterator[bytes], **kwargs: object) -> None:
        copies.append(1)
        real_copy(conn, quoted, chunks, **kwargs)  # type: ignore[arg-type]

    def counted(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            batch_sizes.append(len(batch))
            yield batch

    monkeypatch.setattr(partition_store, "copy_chunks", counting_copy)
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    with staging.open_clean(tmp_path) as staged:
        assert staged.row_count == ROWS and staged.duplicates_dropped == 3
        batches = staged.arrow_batches(1_000) if kind == "arrow" else staged.row_batches(batch_rows=1_000)
        audit = store.overwrite(
            lease, counted(batches), staged.rejects, processing_version="v", duplicate_count=staged.duplicates_dropped,
        )  # fmt: skip
    assert batch_sizes == [1_000, 1_000, 500]  # never the day in one frame
    assert copies == ([1] if store.dialect == "postgresql" else [])  # one COPY of all the batches
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
@pytest.mark.parametrize("kind", ["arrow", "frames"])
def test_the_backend_terminated_mid_copy_leaves_the_old_partition(postgres_url: str, kind: str) -> None:
    """pg_terminate_backend while the COPY runs, its first batch sent: the old rows and audit stay,
    the retry loads."""
    import pyarrow as pa
    import sqlalchemy as sa

    from onceflow.sales.schema import sales_arrow_schema

    engine = make_engine(postgres_url)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    old = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=1), day_rows(10), processing_version="v"
    )
    new = day_rows(2_500)
    admin = sa.create_engine(postgres_url)

    def batch(rows: pd.DataFrame) -> Any:
        if kind == "frames":
            return rows
        return pa.RecordBatch.from_pandas(rows, schema=sales_arrow_schema(), preserve_index=False)

    def batches_then_terminate() -> Iterator[Any]:
        yield batch(new.iloc[:1_000])
        copying = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state = 'active' AND query LIKE 'COPY %'"
        )
        with admin.connect() as conn:  # the loader's COPY is running, waiting for the next rows
            for _ in range(100):
                pids = conn.execute(sa.text(copying)).scalars().all()
                if pids:
                    break
                time.sleep(0.05)
            killed = conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pids[0]}).all()
        assert killed == [(True,)]
        yield batch(new.iloc[1_000:])

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


@pytest.mark.postgres
def test_a_disk_full_error_at_row_50000_of_the_copy_leaves_the_old_partition(postgres_url: str) -> None:
    """The server fails the COPY at its 50,000th row with SQLSTATE 53100 (disk_full, what "could not
    extend file: No space left on device" raises; a trigger stands in for the full disk): the old
    rows and audit stay, and the retry, once there is room, loads."""
    import pyarrow as pa
    import sqlalchemy as sa

    from onceflow.sales.schema import sales_arrow_schema

    engine = make_engine(postgres_url)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    old = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=1), day_rows(10), processing_version="v"
    )
    new = pa.RecordBatch.from_pandas(day_rows(60_000), schema=sales_arrow_schema(), preserve_index=False)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SEQUENCE disk_rows")
        conn.exec_driver_sql(
            "CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF nextval('disk_rows') = 50000 THEN RAISE EXCEPTION 'could not extend file: No space left"
            " on device' USING ERRCODE = 'disk_full'; END IF; RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER disk_full BEFORE INSERT ON daily_sales FOR EACH ROW EXECUTE FUNCTION disk_full()"
        )
    import psycopg2

    with pytest.raises((sa.exc.DBAPIError, psycopg2.errors.DiskFull), match="No space left on device"):
        store.overwrite(
            store.acquire_lease(DAY, run_id="r", try_number=2),
            [new.slice(i, 10_000) for i in range(0, 60_000, 10_000)],
            processing_version="v",
        )
    assert store.audit(DAY) == old and len(store.partition_rows(DAY)) == 10
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER disk_full ON daily_sales")
    retried = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=3), [new], processing_version="v"
    )
    assert retried.row_count == 60_000 and store.partition_checksum(DAY) == retried.checksum
    engine.dispose()


def test_a_checksum_spilled_to_runs_equals_the_read_back(
    sales_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past checksum.SPILL_ROWS the digests go to sorted runs in a temporary file, merged at the end:
    the audit's checksum is still the one the rows read back give."""
    import pyarrow as pa

    from onceflow.sales import checksum
    from onceflow.sales.schema import sales_arrow_schema

    monkeypatch.setattr(checksum, "SPILL_ROWS", 700)
    monkeypatch.setattr(checksum, "_MERGE_ROWS", 64)
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    table = pa.Table.from_pandas(day_rows(ROWS), schema=sales_arrow_schema(), preserve_index=False)
    audit = store.overwrite(
        store.acquire_lease(DAY, run_id="r", try_number=1),
        table.to_batches(max_chunksize=300),
        processing_version="v",
    )
    assert audit.row_count == ROWS and audit.checksum == store.partition_checksum(DAY)


@pytest.mark.parametrize("full", [False, True], ids=["loaded", "ratio-exceeded"])
def test_a_days_rejects_stream_into_the_warehouse_in_batches(
    sales_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    """The rejects went into the load whole: read as one frame, made rows and then dicts at once
    (about 1 kB a reject: a 10M-row day at the 5 % reject ratio took 500 MB more than the 600 MB
    budget). Now they stream from rejects.parquet and are inserted a few thousand at a time, for a
    load and for a load refused by the reject ratio (record_rejects)."""
    n = 2_500
    rejects = pd.DataFrame(
        {
            "source_row_id": np.arange(n, dtype="int64"),
            "order_id": [None if i % 7 == 0 else f"O-{i}\t\\N" for i in range(n)],
            "reason": ["bad_amount"] * n,
            "raw": [f'{{"row_id": {i}}}' for i in range(n)],
        }
    )
    result = CleanResult(rows=day_rows(10), rejects=rejects, source_rows=10 + n, duplicates_dropped=0)
    staging.write_clean(tmp_path, result, partition=DAY, processing_version="v")

    inserted: list[int] = []
    real_records = partition_store.frame_records

    def counted_records(df: pd.DataFrame, columns: Any) -> Any:
        if list(columns) == list(REJECT_COLUMNS):
            inserted.append(len(df))
        return real_records(df, columns)

    monkeypatch.setattr(partition_store, "frame_records", counted_records)
    monkeypatch.setattr(partition_store, "REJECT_INSERT_ROWS", 700)
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    with staging.open_clean(tmp_path) as staged:
        assert staged.reject_count == n and staged.reject_ratio == n / (10 + n)
        batches = staged.reject_batches(1_000)
        if full:
            store.overwrite(lease, staged.arrow_batches(), processing_version="v")
            store.record_rejects(store.acquire_lease(DAY, run_id="r", try_number=2), batches)
        else:
            audit = store.overwrite(lease, staged.arrow_batches(), batches, processing_version="v")
            assert audit.reject_count == n
    assert inserted == [700, 300] * 2 + [500]  # never the day's rejects at once
    assert store.audit(DAY).reject_count == n  # type: ignore[union-attr]
    stored = store.partition_rejects(DAY)
    assert [tuple(r.values()) for r in stored] == real_records(rejects, REJECT_COLUMNS)
