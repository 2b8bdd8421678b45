"""Two extract tries of one run overlap on the same staging folder (a zombie and its retry).

Try A reads the shop first and is paused at a named point of its staging write; the late rows
arrive; try B reads the shop and stages everything; A resumes and finishes. Whatever order the
renames land in, the load must commit one try's rows with that same try's watermark: the
watermark travels inside the staged file (parquet metadata, or a text file's header) and is read
back with the rows. (When it lived
in a separate ``extract.json``, A paused after its parquet rename gave B's rows with A's older
watermark, and A paused before it gave A's rows with B's newer watermark, which would then beat
a genuinely newer extract.) The real DAG's extract and clean callables run against a SQLite shop;
the load runs into SQLite or PostgreSQL; the result is read back with plain SQL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import types
from typing import TYPE_CHECKING, Any

import pandas as pd
import pendulum
import pytest
import sqlalchemy as sa

from onceflow.sales.clean import clean_orders
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.sales.partitions import day_bounds_utc
from onceflow.sales.shop_query import SourceExtract, columns_frame, rows_frame

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from airflow.sdk import ObjectStoragePath

AMS = "Europe/Amsterdam"
DAY = dt.date(2024, 10, 27)
CONFIG = GeneratorConfig(seed=41, orders_per_day=60, late_rate=0.2)
CUTOFF = dt.datetime(2024, 10, 27, 23, 5)  # what the shop held when try A read it


def write_shop(url: str, *, late: bool) -> None:
    rows = generate_orders(DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=2), CONFIG)
    engine = make_engine(url)
    try:
        write_orders(engine, [r for r in rows if (r.ingested_at_utc >= CUTOFF) == late])
    finally:
        engine.dispose()


class Gate:
    """A pause point: the thread that reaches it says so and waits until the test lets it go."""

    def __init__(self) -> None:
        self.arrived, self.go = threading.Event(), threading.Event()

    def pass_through(self) -> None:
        self.arrived.set()
        assert self.go.wait(60), "never released"


@pytest.mark.parametrize("staging_format", ["text", "parquet"])
@pytest.mark.parametrize("storage", ["file", "gcs"])
@pytest.mark.parametrize("paused", ["older_try", "newer_try"])
def test_overlapping_extract_tries_never_pair_one_trys_rows_with_anothers_watermark(
    paused: str,
    storage: str,
    staging_format: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    sales_db_url: str,
    sales_connections: Callable[[str, str], Path],
) -> None:
    """older_try: A (early read) stops after publishing its extract; B runs to the end; A ends.
    newer_try: A stops after its read; B (late read) stops after publishing its extract; A runs to
    the end; B ends. The files left are B's in the first case and A's in the second. The day
    staged as text (``extract.tsv``, the default for a day this small) and as parquet."""
    from onceflow.hooks.warehouse import ShopDbHook
    from onceflow.operators.partition import PartitionOverwriteOperator
    from onceflow.sales import staging
    from onceflow.sales.text_staging import TEXT_ROWS_ENV
    from onceflow.testing.dag_runner import load_dag

    if staging_format == "parquet":  # else the day (about 60 orders) is staged as text
        monkeypatch.setenv(TEXT_ROWS_ENV, "0")
    extract_name = {"text": staging.EXTRACT_TEXT, "parquet": staging.EXTRACT_PARQUET}[staging_format]
    shop = f"sqlite:///{tmp_path / 'shop.db'}"
    sales_connections(shop, sales_db_url)
    if storage == "gcs":  # staged in a bucket through onceflow_storage, not in a local folder
        fake_gcs = request.getfixturevalue("fake_gcs")
        bucket = fake_gcs.bucket()
        monkeypatch.delenv("ONCEFLOW_SALES_STAGING_DIR")
        monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_STORAGE", fake_gcs.connection_json(base=f"gs://{bucket}"))
    write_shop(shop, late=False)
    dag = load_dag("daily_sales")
    tasks: Any = dag.task_dict
    extract, clean = tasks["extract"].python_callable, tasks["clean"].python_callable
    gates = {
        "A:read": Gate() if paused == "newer_try" else None,
        "A:published": Gate() if paused == "older_try" else None,
        "B:published": Gate() if paused == "newer_try" else None,
    }

    def point(name: str) -> None:
        gate = gates.get(f"{threading.current_thread().name}:{name}")
        if gate is not None:
            gate.pass_through()

    # Each try's read (rows and watermark), recorded by the thread that made it.
    reads: dict[str, Any] = {}
    real_read = ShopDbHook.stream_interval

    @contextlib.contextmanager
    def recording_read(self: ShopDbHook, start: dt.datetime, end: dt.datetime) -> Any:
        # The DAG streams the read; the test takes the (small) day whole to record and pause.
        with real_read(self, start, end) as (watermark, batches):
            frames = list(batches)
            frame = pd.concat(map(columns_frame, frames), ignore_index=True) if frames else rows_frame([])
            reads[threading.current_thread().name] = SourceExtract(frame, watermark)
            point("read")
            yield watermark, iter(frames)

    monkeypatch.setattr(ShopDbHook, "stream_interval", recording_read)
    real_write_object, real_rename = staging.write_object, staging.rename_into_place

    def pausing_write_object(path: ObjectStoragePath, data: bytes) -> None:
        real_write_object(path, data)
        if path.name == extract_name:  # uploaded (or renamed, locally): other readers now see it
            point("published")

    def pausing_rename(temp: str, path: ObjectStoragePath) -> None:
        real_rename(temp, path)
        if path.name == extract_name:  # renamed: other readers now see it
            point("published")

    monkeypatch.setattr(staging, "write_object", pausing_write_object)
    monkeypatch.setattr(staging, "rename_into_place", pausing_rename)

    start, end = (pendulum.instance(b) for b in day_bounds_utc(DAY, AMS))
    context = {"data_interval_start": start, "data_interval_end": end, "dag": dag, "run_id": "scheduled__x"}
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run_try(name: str) -> None:
        try:
            results[name] = extract(**context)
        except BaseException as exc:
            errors.append(exc)
            for gate in gates.values():
                if gate is not None:
                    gate.arrived.set()

    def reach(name: str) -> threading.Thread:
        thread = threading.Thread(target=run_try, args=(name[0],), name=name[0])
        thread.start()
        gate = gates[name]
        assert gate is not None and gate.arrived.wait(60) and not errors, errors
        return thread

    if paused == "older_try":
        try_a = reach("A:published")
        write_shop(shop, late=True)  # the late rows arrive between the two reads
        try_b = threading.Thread(target=run_try, args=("B",), name="B")
        try_b.start()
        try_b.join()
        gates["A:published"].go.set()  # type: ignore[union-attr]
        try_a.join()
        winner = "B"
    else:
        try_a = reach("A:read")
        write_shop(shop, late=True)
        try_b = reach("B:published")
        gates["A:read"].go.set()  # type: ignore[union-attr]
        try_a.join()
        gates["B:published"].go.set()  # type: ignore[union-attr]
        try_b.join()
        winner = "A"
    assert not errors, errors
    assert results["A"]["staging_dir"] == results["B"]["staging_dir"]  # one run, one folder
    if storage == "gcs":
        assert results["A"]["staging_dir"].startswith(f"gs://{bucket}/sales-staging/daily_sales/2024-10-27/")
        staged = fake_gcs.objects(bucket)
        assert [name.rsplit("/", 1)[1] for name in staged] == [extract_name], staged
    assert len(reads["A"].frame) < len(reads["B"].frame)  # B saw the late rows
    assert reads["A"].watermark_utc < reads["B"].watermark_utc

    cleaned = clean(**context)  # finds the run's folder itself, as in the DAG
    load = PartitionOverwriteOperator(
        task_id="load", partition=DAY.isoformat(), staging_dir=cleaned["staging_dir"], ledger_conn_id=None
    )
    task_context: Any = {
        "run_id": "scheduled__x",
        "ti": types.SimpleNamespace(try_number=1, dag_id="daily_sales"),
    }
    load.execute(task_context)

    # Whichever rename landed last, the warehouse holds that try's rows and that try's watermark.
    engine = sa.create_engine(sales_db_url)
    try:
        with engine.connect() as conn:
            watermark, rejects = conn.execute(
                sa.text("SELECT source_watermark_utc, reject_count FROM load_audit WHERE partition_key = :k"),
                {"k": DAY.isoformat()},
            ).one()
            stored, net = conn.execute(
                sa.text(
                    "SELECT count(*), coalesce(sum(net_cents), 0) FROM daily_sales WHERE partition_date = :d"
                ),
                {"d": DAY},
            ).one()
    finally:
        engine.dispose()
    if isinstance(watermark, str):
        watermark = dt.datetime.fromisoformat(watermark)
    expected = clean_orders(reads[winner].frame, partition=DAY)
    assert (stored, int(net), rejects) == (
        len(expected.rows),
        int(expected.rows["net_cents"].sum()),
        len(expected.rejects),
    ), f"the partition does not hold try {winner}'s rows"
    assert watermark == reads[winner].watermark_utc, (
        f"try {winner}'s rows were loaded under the other try's watermark"
    )
