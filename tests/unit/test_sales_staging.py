"""Staging files in a local folder: atomic writes through onceflow.files (temp file, fsync, rename),
also when two tries of a task overlap. Object storage (file:// and gs://): tests/integration/
test_sales_staging_storage.py."""

from __future__ import annotations

import datetime as dt
import os
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from onceflow.files import replace_atomic, write_temp
from onceflow.sales import staging
from onceflow.sales.generator import GeneratorConfig
from onceflow.testing.sales_fixtures import clean_day

DAY = dt.date(2024, 10, 27)
RESULT = clean_day(DAY, GeneratorConfig(seed=4, orders_per_day=200))


def test_write_and_read_clean_round_trip(tmp_path: Path) -> None:
    staging.write_clean(tmp_path, RESULT, partition=DAY, processing_version="v1")

    staged = staging.read_clean(tmp_path)

    assert staged.partition == DAY
    assert len(staged.rows) == len(RESULT.rows)
    assert len(staged.rejects) == len(RESULT.rejects)
    assert staged.source_rows == RESULT.source_rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "rejects.parquet", "rows.parquet"]


def test_two_live_tries_writing_one_run_folder_never_tear_a_file(tmp_path: Path) -> None:
    """A zombie try and its retry write the same folder at once: no crash, no torn or stray file."""
    folder = tmp_path / "run"
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer() -> None:
        try:
            start.wait()
            for _ in range(15):
                staging.write_clean(folder, RESULT, partition=DAY, processing_version="v1")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    reference = tmp_path / "reference"
    staging.write_clean(reference, RESULT, partition=DAY, processing_version="v1")
    staged, expected = staging.read_clean(folder), staging.read_clean(reference)
    pd.testing.assert_frame_equal(staged.rows, expected.rows)
    pd.testing.assert_frame_equal(staged.rejects, expected.rejects)
    assert (folder / "manifest.json").read_bytes() == (reference / "manifest.json").read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "rejects.parquet", "rows.parquet"]


def test_concurrent_writers_use_distinct_temporary_names(tmp_path: Path) -> None:
    target = tmp_path / "rows.parquet"
    first, second = write_temp(str(target), b"first"), write_temp(str(target), b"second")
    assert first != second
    assert Path(first).parent == Path(second).parent == tmp_path
    assert Path(first).name.startswith(".rows.parquet.") and Path(first).name.endswith(".tmp")
    os.replace(second, target)
    os.replace(first, target)
    assert target.read_bytes() == b"first"  # renamed last
    assert list(tmp_path.iterdir()) == [target]


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "manifest.json"
    replace_atomic(target, b"old")
    real_write = os.write
    calls = 0

    def failing_write(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError(28, "No space left on device")
        return real_write(fd, bytes(data[:4]))

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        replace_atomic(target, b"half and then some")

    assert calls == 2
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_the_watermark_travels_inside_the_parquet_files(tmp_path: Path) -> None:
    """The load's watermark is in rows.parquet's own metadata: the manifest cannot change it."""
    import json

    import pyarrow.parquet as pq

    source = staging.StagedExtract(pd.DataFrame(), dt.datetime(2024, 10, 28, 9, 30), "extract-1")
    staging.write_clean(tmp_path, RESULT, partition=DAY, processing_version="v1", source=source)
    facts = json.loads(pq.read_schema(tmp_path / "rows.parquet").metadata[staging.METADATA_KEY])
    assert facts["source_watermark_utc"] == "2024-10-28 09:30:00"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(
        json.dumps({**manifest, "source_watermark_utc": "2030-01-01 00:00:00"})
    )

    assert staging.read_clean(tmp_path).source_watermark_utc == dt.datetime(2024, 10, 28, 9, 30)


def test_rows_and_rejects_of_different_extracts_are_refused(tmp_path: Path) -> None:
    """Two clean tries of two extract tries overlapping: rows of one, rejects of the other."""
    first = staging.StagedExtract(pd.DataFrame(), dt.datetime(2024, 10, 27, 23, 5), "extract-a")
    second = staging.StagedExtract(pd.DataFrame(), dt.datetime(2024, 10, 28, 9, 30), "extract-b")
    staging.write_clean(tmp_path, RESULT, partition=DAY, processing_version="v1", source=first)
    other = tmp_path / "other"
    staging.write_clean(other, RESULT, partition=DAY, processing_version="v1", source=second)
    (other / "rejects.parquet").replace(tmp_path / "rejects.parquet")

    with pytest.raises(staging.StagingMismatchError, match="different clean or extract tries"):
        staging.read_clean(tmp_path)
