"""Cleaning in bounded memory (``clean_stream.DayCleaner``, ``staging.clean_extract``) gives what the
whole-day ``clean_orders`` gives, on generated days made messy on purpose: exact repeats, refunds
of the day's and earlier orders, conflicting duplicates of every kind (a refund id reused on another
order, a second sale under one order id, a corrected amount, another currency), ties in ingestion
time, NULLs, malformed rows of every reason, rows in any order, with buckets small enough that a
day spans dozens of them and the rejects need merge passes."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import random
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.sales import clean, clean_stream, staging
from onceflow.sales.clean import CleanResult, clean_orders
from onceflow.sales.clean_stream import DayCleaner
from onceflow.sales.schema import ORDER_COLUMNS
from onceflow.testing import sales_fixtures

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

DAY = dt.date(2024, 10, 27)  # 25 hours in Europe/Amsterdam


def messy_day(seed: int, orders: int = 400) -> pd.DataFrame:
    """:func:`onceflow.testing.sales_fixtures.messy_day` of :data:`DAY`."""
    return sales_fixtures.messy_day(DAY, seed, orders)


def stream_clean(source: pd.DataFrame, *, bucket_rows: int, batch_rows: int, folder: Path) -> CleanResult:
    """``DayCleaner`` over ``source`` staged as the extract stages it, read ``batch_rows`` at a time."""
    staging.write_extract(folder, source)
    table = pq.read_table(folder / "extract.parquet")
    folder.joinpath("work").mkdir()
    with DayCleaner(partition=DAY, expected_rows=len(source), workdir=str(folder / "work"),
                    bucket_rows=bucket_rows) as cleaner:  # fmt: skip
        for batch in table.to_batches(max_chunksize=batch_rows):
            cleaner.add(batch)
        cleaner.dedupe()
        tables = list(cleaner.rows())
        assert all(len(table) for table in tables)  # one table per bucket that has rows
        frames = [clean.normalise_sales_frame(table.to_pandas()) for table in tables]
        rejects = pa.concat_tables([pa.Table.from_batches([], schema=clean_stream.reject_schema()),
                                    *cleaner.rejects()]).to_pandas()  # fmt: skip
        rows = (
            pd.concat(frames, ignore_index=True)
            if frames
            else clean_orders(source.iloc[:0], partition=DAY).rows
        )
        assert cleaner.row_count == len(rows)
        assert (
            dict(cleaner.reasons) == rejects["reason"].value_counts().to_dict()
        )  # no reason without a reject
        return CleanResult(rows=rows, rejects=rejects, source_rows=cleaner.source_rows,
                           duplicates_dropped=cleaner.duplicates_dropped)  # fmt: skip


def assert_same(new: CleanResult, old: CleanResult) -> None:
    pd.testing.assert_frame_equal(new.rows, old.rows)
    assert new.rejects.astype(object).values.tolist() == old.rejects.astype(object).values.tolist()
    assert list(new.rejects.columns) == list(old.rejects.columns)
    assert (new.source_rows, new.duplicates_dropped) == (old.source_rows, old.duplicates_dropped)
    assert new.reasons() == old.reasons()


@pytest.mark.parametrize(
    ("seed", "bucket_rows", "batch_rows"),
    # the last three: the day in one bucket, kept in memory (read in one batch, in 37s, one by one)
    [(1, 23, 50), (2, 7, 11), (4, 61, 1000), (3, 100_000, 50_000), (12, 100_000, 37), (13, 100_000, 1)],
)
def test_the_bucketed_clean_equals_the_whole_day_clean(
    seed: int, bucket_rows: int, batch_rows: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clean_stream, "MERGE_FAN_IN", 3)  # the rejects' runs need merge passes
    monkeypatch.setattr(clean_stream, "RUN_BATCH_ROWS", 3)
    monkeypatch.setattr(clean_stream, "FLUSH_ROWS", 150)
    source = messy_day(seed)
    old = clean_orders(source, partition=DAY)
    # the day has everything the comparison is about
    reasons = old.reasons()
    assert reasons["conflicting_duplicate"] > 30 and old.duplicates_dropped > 30
    assert {"nul_byte", "invalid_text", "value_too_long", "sub_cent_amount", "bad_amount"} <= set(reasons)
    assert (old.rows["refund_cents"] > 0).sum() > 50 and old.rows["customer_id"].isna().any()
    assert (old.rows["gross_cents"] == 0).any()

    assert_same(stream_clean(source, bucket_rows=bucket_rows, batch_rows=batch_rows, folder=tmp_path), old)


@pytest.mark.parametrize("bucket_rows", [3, 100_000])
def test_an_empty_day_and_a_day_of_only_rejects(bucket_rows: int, tmp_path: Path) -> None:
    source = messy_day(5, orders=20)
    for name, day in {"empty": source.iloc[:0], "rejects": source.assign(currency="XXX")}.items():
        old = clean_orders(day, partition=DAY)
        assert_same(stream_clean(day, bucket_rows=bucket_rows, batch_rows=4, folder=tmp_path / name), old)


def test_input_order_does_not_matter(tmp_path: Path) -> None:
    source = messy_day(6, orders=150)
    first = stream_clean(source, bucket_rows=17, batch_rows=29, folder=tmp_path / "a")
    backwards = source.sort_values("row_id", ascending=False)
    assert_same(stream_clean(backwards, bucket_rows=17, batch_rows=29, folder=tmp_path / "b"), first)
    # kept in memory: the same, in either order
    assert_same(stream_clean(backwards, bucket_rows=100_000, batch_rows=29, folder=tmp_path / "c"), first)
    assert_same(stream_clean(source, bucket_rows=100_000, batch_rows=29, folder=tmp_path / "d"), first)


def test_a_day_of_one_bucket_is_not_spilled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spill files only where the day spans buckets; the outcome is the same either way."""
    spilled: list[str] = []
    real = clean_stream._Spill.__init__

    def watched(self: clean_stream._Spill, path: str, schema: pa.Schema) -> None:
        spilled.append(path)
        real(self, path, schema)

    monkeypatch.setattr(clean_stream._Spill, "__init__", watched)
    source = messy_day(14, orders=200)
    in_memory = stream_clean(source, bucket_rows=len(source), batch_rows=50, folder=tmp_path / "a")
    assert spilled == []
    assert_same(
        in_memory, stream_clean(source, bucket_rows=len(source) - 1, batch_rows=50, folder=tmp_path / "b")
    )
    assert len(spilled) == 3  # events, orders, rejects: two buckets spill


@pytest.mark.parametrize("bucket_rows", [5, 100_000])
@pytest.mark.parametrize("first", ["rows", "rejects"])
def test_rows_and_rejects_are_read_once(bucket_rows: int, first: str, tmp_path: Path) -> None:
    """A second read raises: the day in one bucket hands its rows over as it yields them (a second
    rows() yielded nothing, a day silently lost), the spilled one yielded them again (row_count
    doubled). Closing twice (close() in a with block) does nothing."""
    source = messy_day(15, orders=60)
    staging.write_extract(tmp_path, source)
    table = pq.read_table(tmp_path / "extract.parquet")
    second = {"rows": "rejects", "rejects": "rows"}[first]
    with DayCleaner(
        partition=DAY, expected_rows=len(source), workdir=str(tmp_path), bucket_rows=bucket_rows
    ) as cleaner:
        cleaner.add(table)
        cleaner.dedupe()
        counts = {step: sum(len(t) for t in getattr(cleaner, step)()) for step in (first, second)}
        assert counts["rows"] == cleaner.row_count > 0 and counts["rejects"] == cleaner.reject_count > 0
        for step in (first, second):
            with pytest.raises(RuntimeError, match=f"{step}\\(\\) runs once"):
                next(getattr(cleaner, step)())
        assert cleaner.row_count == counts["rows"]
        cleaner.close()


def test_a_small_day_is_cleaned_without_pyarrow_compute(tmp_path: Path) -> None:
    """A clean task of a day in one bucket does not import pyarrow.compute (0.06 s of CPU in each task
    process without the preload); one of several buckets does (it sorts and takes with it)."""
    import subprocess
    import sys

    staging.write_extract(tmp_path, messy_day(6, orders=150))
    code = (
        "import sys, datetime as dt\n"
        "from onceflow.sales import staging\n"
        f"s = staging.clean_extract({str(tmp_path)!r}, partition=dt.date(2024, 10, 27), processing_version='v',"
        " bucket_rows=int(sys.argv[1]))\n"
        "print(s.rows > 50 and s.rejects > 5, 'pyarrow.compute' in sys.modules, 'pandas' in sys.modules)\n"
    )
    runs = {
        rows: subprocess.run(
            [sys.executable, "-c", code, str(rows)], capture_output=True, text=True, check=True
        )
        for rows in (100_000, 20)
    }
    assert runs[100_000].stdout.split() == ["True", "False", "False"], runs[100_000].stderr
    assert runs[20].stdout.split() == ["True", "True", "False"], runs[20].stderr


def test_clean_extract_stages_what_write_clean_of_clean_orders_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staged files read back the same (rows, rejects, facts) and the manifests are equal."""
    monkeypatch.setattr(staging, "EXTRACT_READ_ROWS", 37)
    source = messy_day(7)
    old, new = tmp_path / "old", tmp_path / "new"
    for folder in (old, new):
        staging.write_extract(folder, source, source_watermark_utc=dt.datetime(2024, 10, 28, 1, 2, 3))
    extract = staging.read_extract(old)
    staging.write_clean(old, clean_orders(extract.frame, partition=DAY), partition=DAY,
                        processing_version="v", source=extract)  # fmt: skip
    (new / "extract.parquet").write_bytes((old / "extract.parquet").read_bytes())  # one extract id
    summary = staging.clean_extract(new, partition=DAY, processing_version="v", bucket_rows=50)

    before, after = staging.read_clean(old), staging.read_clean(new)
    pd.testing.assert_frame_equal(after.rows, before.rows)
    pd.testing.assert_frame_equal(after.rejects, before.rejects)
    assert dataclasses.replace(after, rows=None, rejects=None) == dataclasses.replace(
        before, rows=None, rejects=None
    )
    assert json.loads((new / "manifest.json").read_text()) == json.loads((old / "manifest.json").read_text())
    assert (summary.rows, summary.rejects) == (len(before.rows), len(before.rejects))
    assert pq.ParquetFile(new / "rows.parquet").metadata.num_row_groups > 5  # many buckets
    with staging.open_clean(new) as streamed:
        batches = list(streamed.row_batches(batch_rows=100))
    pd.testing.assert_frame_equal(pd.concat(batches, ignore_index=True), before.rows)


def old_fingerprints(valid: pd.DataFrame) -> list[str]:
    """The event fingerprint per value, as clean._dedupe built it before it was vectorised: str() of
    each value; in a column with a missing value, "=" and str(), or "-" for a missing one."""
    from decimal import Decimal

    def missing(v: object) -> bool:
        return v is None or v is pd.NaT or v != v

    amounts = [str(Decimal(str(a).strip()).quantize(Decimal("0.01"))) for a in valid["amount"]]
    columns = []
    for name in clean._EVENT_FIELDS:
        values = valid[name].tolist()
        tagged = any(missing(v) for v in values)
        columns.append([("-" if missing(v) else f"={v}") if tagged else str(v) for v in values])
    return ["\x00".join(parts) for parts in zip(amounts, *columns, strict=True)]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_the_event_fingerprints_are_the_per_value_ones(unit: str) -> None:
    valid = messy_day(8, orders=120)
    valid = valid[clean._reject_reasons(valid).isna()].reset_index(drop=True)
    times = [dt.datetime(5, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 0, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
             dt.datetime(1969, 12, 31, 23, 59, 59, 500000), dt.datetime(1800, 2, 28, 1, 2, 3, 1000)]  # fmt: skip
    if unit == "ns":
        times = [times[1], times[3], times[4]]  # years 5 and 9999 do not fit nanoseconds
    valid.loc[: len(times) - 1, "created_at_utc"] = times
    valid["created_at_utc"] = valid["created_at_utc"].astype(f"datetime64[{unit}]")
    assert clean._event_fingerprints(valid) == old_fingerprints(valid)
    valid["created_at_utc"] = valid["created_at_utc"].astype(object)  # plain datetimes: per value
    assert clean._event_fingerprints(valid) == old_fingerprints(valid)


def test_missing_event_and_ingestion_times_sort_as_the_reference_sorts_them(tmp_path: Path) -> None:
    """The shop's columns are NOT NULL, but a typed shop's need not be: a missing time sorts last
    when picking a key's winner and an order's first event, as pandas sorts NaT, and is skipped by
    the order's first event time."""
    source = messy_day(9, orders=200)
    rng = random.Random(9)
    for column in ("created_at_utc", "ingested_at_utc"):
        values = source[column].astype(object)
        values[rng.sample(range(len(source)), len(source) // 6)] = None
        source[column] = pd.to_datetime(values)
    old = clean_orders(source, partition=DAY)
    assert source["ingested_at_utc"].isna().sum() > 30 and source["created_at_utc"].isna().sum() > 30
    assert old.duplicates_dropped > 0 and old.reasons()["conflicting_duplicate"] > 0
    assert_same(stream_clean(source, bucket_rows=13, batch_rows=41, folder=tmp_path), old)


def test_an_extract_staged_through_pandas_with_a_column_of_nulls_cleans_as_the_reference(
    tmp_path: Path,
) -> None:
    """Extracts staged before the extract built its Arrow columns itself went through
    ``pa.Table.from_pandas``, which types a text column holding only NULLs (``refund_id`` on a day
    without refunds) ``null``, not binary; a retried clean of such a staged day must still run."""
    source = messy_day(10, orders=80)
    source = source[(source["event_type"] == "sale") & source["refund_id"].isna()].reset_index(drop=True)
    frame = source.copy()
    for col in clean._TEXT_COLUMNS:  # as write_extract staged text then: bytes, surrogateescape
        frame[col] = pd.Series([v.encode("utf-8", "surrogateescape") if isinstance(v, str) else None
                                for v in frame[col]], dtype=object)  # fmt: skip
    for col in ("created_at_utc", "ingested_at_utc"):
        frame[col] = frame[col].astype("datetime64[us]")
    table = pa.Table.from_pandas(frame.loc[:, list(ORDER_COLUMNS)], preserve_index=False)
    assert table.schema.field("refund_id").type == pa.null()
    old, new = tmp_path / "old", tmp_path / "new"
    for folder in (old, new):
        folder.mkdir()
        pq.write_table(table, folder / "extract.parquet")
    extract = staging.read_extract(old)
    staging.write_clean(old, clean_orders(extract.frame, partition=DAY), partition=DAY,
                        processing_version="v", source=extract)  # fmt: skip
    staging.clean_extract(new, partition=DAY, processing_version="v", bucket_rows=7)
    before, after = staging.read_clean(old), staging.read_clean(new)
    assert len(before.rows) > 20 and len(before.rejects) > 0
    pd.testing.assert_frame_equal(after.rows, before.rows)
    pd.testing.assert_frame_equal(after.rejects, before.rejects)


@pytest.mark.parametrize("bucket_rows", [5, 100_000])
@pytest.mark.parametrize("failing", ["reject_reason", "dedupe_positions", "net_per_order", None])
def test_the_cycle_collector_is_paused_only_while_rules_run(
    failing: str | None,
    bucket_rows: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Off inside the rules, on again after each step, after a rule that raises and after rows()
    is left half read (a clean task that fails goes on to Airflow's own code in that process)."""
    import gc

    request.addfinalizer(gc.enable)  # a leak fails this test, not the tests after it
    seen: list[bool] = []

    def watching(name: str) -> Callable[..., object]:
        real = getattr(clean_stream, name)

        def watched(*args: object) -> object:
            seen.append(gc.isenabled())
            if failing == name:
                raise RuntimeError("a rule failed")
            return real(*args)

        return watched

    for name in ("reject_reason", "dedupe_positions", "net_per_order"):
        monkeypatch.setattr(clean_stream, name, watching(name))
    source = messy_day(11, orders=40)
    staging.write_extract(tmp_path, source)
    table = pq.read_table(tmp_path / "extract.parquet")
    assert gc.isenabled()
    with (
        pytest.raises(RuntimeError) if failing else contextlib.nullcontext(),
        DayCleaner(
            partition=DAY, expected_rows=len(source), workdir=str(tmp_path), bucket_rows=bucket_rows
        ) as cleaner,
    ):
        cleaner.add(table)
        assert gc.isenabled()
        cleaner.dedupe()
        assert gc.isenabled()
        for _ in cleaner.rows():  # one bucket's rows, then the rest abandoned
            assert gc.isenabled()
            break
    assert gc.isenabled()
    assert seen and not any(seen)
