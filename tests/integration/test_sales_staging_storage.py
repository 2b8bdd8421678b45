"""daily_sales' staging through ``onceflow_storage`` (``ObjectStoragePath``): local files and GCS.

The folder comes from ``StorageHook().sales_staging()`` exactly as the DAG's extract task gets
it; what is stored is read back independently: the file system with ``open``, the fake GCS
server over its JSON API with ``urllib`` (``onceflow_fake_gcs.objects``), parquet decoded from
those bytes. Crashes are a write that raises (local) and a SIGKILLed uploader (GCS).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from onceflow.sales import staging
from onceflow.sales.clean import clean_orders
from onceflow.sales.generator import GeneratorConfig
from onceflow.testing.gcs_fixtures import StallingProxy
from onceflow.testing.sales_fixtures import clean_day, source_frame

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow.sdk import ObjectStoragePath

CONN = "AIRFLOW_CONN_ONCEFLOW_STORAGE"
CTX = multiprocessing.get_context("spawn")
DAY = dt.date(2024, 10, 27)
CONFIG = GeneratorConfig(seed=4, orders_per_day=200)
WATERMARK = dt.datetime(2024, 10, 28, 9, 30)
RUN_ID = "scheduled__2024-10-27T22:00:00+00:00"
NAMES = ["extract.parquet", "manifest.json", "rejects.parquet", "rows.parquet"]
TEXT = ("order_id", "event_type", "refund_id", "customer_id", "amount", "currency")


@dataclasses.dataclass
class Staging:
    """One run's staging folder and an independent reader of everything stored under it."""

    folder: ObjectStoragePath
    prefix: str  # the folder's key relative to the storage base (sales-staging/daily_sales/...)
    read_all: Callable[[], dict[str, bytes]]  # every object/file under the base, name -> bytes

    def stored(self) -> dict[str, bytes]:
        """What is stored in this folder, by name (temporary files included)."""
        return {
            name[len(self.prefix) + 1 :]: data
            for name, data in self.read_all().items()
            if name.startswith(self.prefix + "/")
        }


@pytest.fixture(params=["file", "gcs"])
def stage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Staging:
    """``onceflow_storage`` on a local folder or a fresh fake GCS bucket; no staging override."""
    from onceflow.hooks.storage import StorageHook

    monkeypatch.delenv("ONCEFLOW_SALES_STAGING_DIR", raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    if request.param == "file":
        root = tmp_path / "storage"
        monkeypatch.setenv(CONN, json.dumps({"conn_type": "generic", "extra": {"base": root.as_uri()}}))

        def read_all() -> dict[str, bytes]:
            return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    else:
        fake_gcs = request.getfixturevalue("fake_gcs")
        bucket = fake_gcs.bucket()
        monkeypatch.setenv(CONN, fake_gcs.connection_json(base=f"gs://{bucket}"))

        def read_all() -> dict[str, bytes]:
            return dict(fake_gcs.objects(bucket))

    folder = staging.run_dir(StorageHook().sales_staging(), "daily_sales", DAY, RUN_ID)
    prefix = "sales-staging/daily_sales/2024-10-27/" + folder.name
    return Staging(folder, prefix, read_all)


def extract_frame() -> pd.DataFrame:
    """The shop rows of DAY as the extract hands them over, one value with a byte that is not UTF-8."""
    frame = source_frame(DAY, CONFIG)
    for col in TEXT:
        frame[col] = pd.Series(frame[col].tolist(), index=frame.index, dtype=object)
    frame.loc[0, "customer_id"] = "C\udcffD"  # byte 0xFF as the shop's driver read it
    return frame


def parquet(data: bytes) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rows and onceflow facts decoded from stored bytes, without the staging module."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(data))
    return table.to_pandas(), json.loads(table.schema.metadata[b"onceflow.staging"])


def test_a_run_is_staged_under_onceflow_storage_and_read_back_whole(stage: Staging, tmp_path: Path) -> None:
    from onceflow.hooks.storage import StorageHook

    frame = extract_frame()
    staging.write_extract(stage.folder, frame, source_watermark_utc=WATERMARK)
    uri = staging.folder_uri(stage.folder)  # what XCom carries to the next task
    assert uri.endswith("/" + stage.prefix) and uri.startswith(("file:///", "gs://"))

    source = staging.read_extract(StorageHook().path(uri))
    assert source.source_watermark_utc == WATERMARK and source.extract_id
    assert source.frame["customer_id"].tolist() == frame["customer_id"].tolist()  # the 0xFF byte kept
    result = clean_orders(source.frame, partition=DAY)
    staging.write_clean(
        StorageHook().path(uri), result, partition=DAY, processing_version="v1", source=source
    )

    stored = stage.stored()
    assert sorted(stored) == NAMES  # no temporary file or object left
    extract_rows, extract_facts = parquet(stored["extract.parquet"])
    assert extract_facts == {"source_watermark_utc": "2024-10-28 09:30:00", "extract_id": source.extract_id}
    assert len(extract_rows) == len(frame) and extract_rows.loc[0, "customer_id"] == b"C\xffD"
    rows, facts = parquet(stored["rows.parquet"])
    _, reject_facts = parquet(stored["rejects.parquet"])
    assert (
        facts
        == reject_facts
        == {
            "partition": "2024-10-27",
            "source_rows": len(frame),
            "processing_version": "v1",
            "source_watermark_utc": "2024-10-28 09:30:00",
            "extract_id": source.extract_id,
            "duplicates_dropped": result.duplicates_dropped,
        }
    )
    assert len(rows) == len(result.rows) > 0
    manifest = json.loads(stored["manifest.json"])
    assert (manifest["rows"], manifest["rejects"]) == (len(result.rows), len(result.rejects))
    assert "invalid_text" in manifest["reasons"]  # the 0xFF row reached cleaning and was rejected

    staged = staging.read_clean(StorageHook().path(uri))
    reference = tmp_path / "reference"
    staging.write_clean(reference, result, partition=DAY, processing_version="v1", source=source)
    expected = staging.read_clean(reference)
    pd.testing.assert_frame_equal(staged.rows, expected.rows)
    pd.testing.assert_frame_equal(staged.rejects, expected.rejects)
    assert (staged.partition, staged.source_rows, staged.source_watermark_utc) == (DAY, len(frame), WATERMARK)


def test_the_manifest_is_stored_only_after_both_parquet_files(
    stage: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write_object = staging.write_object
    seen: list[tuple[str, list[str], list[str]]] = []  # (name, stored before, stored after)

    def observed_write(path: ObjectStoragePath, data: bytes) -> None:
        before = sorted(stage.stored())
        real_write_object(path, data)
        seen.append((path.name, before, sorted(stage.stored())))

    monkeypatch.setattr(staging, "write_object", observed_write)
    staging.write_clean(stage.folder, clean_day(DAY, CONFIG), partition=DAY, processing_version="v1")

    assert [name for name, _, _ in seen] == ["rows.parquet", "rejects.parquet", "manifest.json"]
    assert seen[-1][1] == ["rejects.parquet", "rows.parquet"]  # both complete before the manifest
    assert all("manifest.json" not in before for _, before, _ in seen)
    assert seen[-1][2] == ["manifest.json", "rejects.parquet", "rows.parquet"]


def _clean_writer_over_its_file_size_limit(folder: str, limit: int, killed: bool) -> None:
    """write_clean of another day into the local ``folder`` while the kernel refuses writes past
    ``limit`` bytes (``RLIMIT_FSIZE``): SIGXFSZ kills the writer mid-file, or, ignored (Python's
    default), the write fails with EFBIG and the writer raises (exit code 3). A child process."""
    import resource

    second = clean_day(DAY, GeneratorConfig(seed=5, orders_per_day=200))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL if killed else signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        staging.write_clean(folder, second, partition=DAY, processing_version="v2")
    except OSError:
        os._exit(3)
    os._exit(0)


@pytest.mark.parametrize("how", ["raises", "killed"])
@pytest.mark.parametrize("stage", ["file"], indirect=True)  # GCS: the killed uploader below
def test_a_local_writer_failing_mid_file_leaves_the_previous_files(stage: Staging, how: str) -> None:
    staging.write_clean(stage.folder, clean_day(DAY, CONFIG), partition=DAY, processing_version="v1")
    before = stage.stored()
    assert len(before["rows.parquet"]) > 4096  # the writer gets part of the way through it

    child = CTX.Process(
        target=_clean_writer_over_its_file_size_limit, args=(stage.folder.path, 4096, how == "killed")
    )
    child.start()
    child.join(120)
    assert child.exitcode == (-signal.SIGXFSZ if how == "killed" else 3)

    after = stage.stored()
    assert {k: v for k, v in after.items() if not k.startswith(".")} == before  # old bytes, all names
    leftovers = sorted(k for k in after if k.startswith("."))
    if how == "raises":
        assert leftovers == []  # the writer removed its temporary file
    else:  # killed: its hidden temporary file stays, cut at the limit, never under the final name
        assert len(leftovers) == 1 and leftovers[0].startswith(".rows.parquet.")
        assert len(after[leftovers[0]]) == 4096
    assert staging.read_clean(stage.folder).processing_version == "v1"


def _killable_clean_writer(conn: str, uri: str) -> None:
    """write_clean of a large day into ``uri``, with ``onceflow_storage`` = ``conn`` (a child)."""
    os.environ[CONN] = conn
    from onceflow.hooks.storage import StorageHook

    big = clean_day(DAY, GeneratorConfig(seed=9, orders_per_day=3000))
    staging.write_clean(StorageHook().path(uri), big, partition=DAY, processing_version="v2")


@pytest.mark.parametrize("stage", ["gcs"], indirect=True)  # local files: the failing write above
def test_a_gcs_writer_killed_mid_upload_leaves_the_previous_objects(
    stage: Staging, request: pytest.FixtureRequest
) -> None:
    fake_gcs = request.getfixturevalue("fake_gcs")
    staging.write_clean(stage.folder, clean_day(DAY, CONFIG), partition=DAY, processing_version="v1")
    before = stage.stored()
    host, port = fake_gcs.url.removeprefix("http://").split(":")
    proxy = StallingProxy((host, int(port)), stall_after=32 << 10)  # rows.parquet is ~100 kB
    bucket = staging.folder_uri(stage.folder).removeprefix("gs://").split("/", 1)[0]
    conn = fake_gcs.connection_json(base=f"gs://{bucket}", endpoint=proxy.url)
    child = CTX.Process(target=_killable_clean_writer, args=(conn, staging.folder_uri(stage.folder)))
    child.start()
    proxy.kill_when_stalled(child, timeout=180)
    time.sleep(0.5)  # let the emulator notice the cut connection
    assert stage.stored() == before, "a partial or new object is visible"
    assert staging.read_clean(stage.folder).processing_version == "v1"


def test_two_live_tries_of_one_folder_leave_one_complete_try(stage: Staging, tmp_path: Path) -> None:
    """A zombie try and its retry stage the same folder at once: no error, no torn or stray file."""
    result = clean_day(DAY, CONFIG)
    tries = {
        name: staging.StagedExtract(pd.DataFrame(), WATERMARK + dt.timedelta(minutes=i), f"extract-{name}")
        for i, name in enumerate("AB")
    }
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(name: str) -> None:
        try:
            start.wait()
            for _ in range(5):
                staging.write_clean(
                    stage.folder, result, partition=DAY, processing_version="v1", source=tries[name]
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(name,)) for name in tries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    stored = stage.stored()
    assert sorted(stored) == NAMES[1:]  # no temporary file or object left
    for name in ("rows.parquet", "rejects.parquet"):  # each one try's complete file
        rows, facts = parquet(stored[name])
        assert facts["extract_id"] in {"extract-A", "extract-B"}
        assert len(rows) == len(result.rows if name == "rows.parquet" else result.rejects)
    try:
        staged = staging.read_clean(stage.folder)
    except staging.StagingMismatchError:  # rows of one try, rejects of the other: refused
        return
    reference = tmp_path / "reference"
    staging.write_clean(reference, result, partition=DAY, processing_version="v1")
    pd.testing.assert_frame_equal(staged.rows, staging.read_clean(reference).rows)


@pytest.mark.parametrize("via", ["ONCEFLOW_STORAGE_DIR", "ONCEFLOW_SALES_STAGING_DIR"])
def test_a_folder_whose_name_looks_percent_encoded_is_staged_there_and_found_again(
    via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A literal ``%41`` in a folder name is decoded once, where a URI is read, never again."""
    from onceflow.hooks.storage import StorageHook

    root = tmp_path / "50%41 off é"  # an absolute path, as the variable takes it: no escapes meant
    monkeypatch.delenv(CONN, raising=False)
    monkeypatch.delenv("ONCEFLOW_SALES_STAGING_DIR", raising=False)
    monkeypatch.setenv(via, str(root))
    base = StorageHook().sales_staging()
    folder = staging.run_dir(base, "daily_sales", DAY, RUN_ID)
    staging.write_extract(folder, extract_frame(), source_watermark_utc=WATERMARK)
    uri = staging.folder_uri(folder)  # what XCom carries

    stored = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet"))
    assert len(stored) == 1 and stored[0].startswith("50%41 off é/")  # not "50A off é/"
    assert sorted(os.listdir(tmp_path)) == ["50%41 off é"]
    # the load, another process: a fresh hook resolves the XCom to the very folder
    source = staging.read_extract(StorageHook().path(uri))
    assert source.source_watermark_utc == WATERMARK
