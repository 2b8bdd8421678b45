"""The BigQuery partition overwrite, with the real google-cloud-bigquery client and BigQueryHook.

BigQuery itself cannot run here. :class:`onceflow.testing.bigquery_stub.BigQueryStub` stands in
for it on 127.0.0.1: it runs the load jobs and models the swap transaction (fence check, delete,
insert, fence update) and jobs that fail. The assertions are on what the real client sent and
on the rows the stub then holds, compared with the SQL audit's checksum.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import types
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sales.checksum import rows_checksum
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partitions import InvalidNameError
from onceflow.testing.bigquery_stub import BigQueryStub
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DAY = dt.date(2024, 10, 27)
PROJECT = "onceflow-test"
TARGET = f"{PROJECT}.sales.daily_sales"
CONFIG = GeneratorConfig(seed=4, orders_per_day=40)
RESULT = clean_day(DAY, CONFIG)
NIGHTLY = clean_day(DAY, CONFIG, ingested_before=dt.datetime(2024, 10, 27, 23, 0))


@pytest.fixture
def bigquery_stub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[BigQueryStub]:
    with BigQueryStub(PROJECT) as stub:
        monkeypatch.setenv("BIGQUERY_EMULATOR_HOST", stub.url)
        conn = {"conn_type": "google_cloud_platform", "extra": {"project": PROJECT, "is_anonymous": True}}
        monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE_BQ", json.dumps(conn))
        audit = {"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}
        monkeypatch.setenv("AIRFLOW_CONN_AUDIT_DB", json.dumps(audit))
        yield stub


def audit_store(tmp_path: Path) -> Any:
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore

    store = PartitionStore(make_engine(f"sqlite:///{tmp_path / 'audit.db'}"), "daily_sales")
    store.create_schema()
    return store


def stage(tmp_path: Path, name: str, result: Any) -> Path:
    from onceflow.sales import staging
    from onceflow.sales.clean import PROCESSING_VERSION

    folder = tmp_path / name
    staging.write_clean(folder, result, partition=DAY, processing_version=PROCESSING_VERSION)
    return folder


def load_op(folder: Path, **kwargs: Any) -> Any:
    from onceflow.operators.partition import PartitionOverwriteOperator

    return PartitionOverwriteOperator(
        task_id="load", partition=DAY.isoformat(), staging_dir=str(folder), warehouse_conn_id="onceflow_warehouse_bq",
        audit_conn_id="audit_db", bigquery_dataset="sales", **kwargs,
    )  # fmt: skip


def context(run_id: str, try_number: int = 1) -> Any:
    return {"run_id": run_id, "ti": types.SimpleNamespace(try_number=try_number, dag_id="daily_sales")}


def test_the_rows_are_staged_then_swapped_in_one_fenced_transaction(
    bigquery_stub: BigQueryStub, tmp_path: Path
) -> None:
    from onceflow.hooks.warehouse import WarehouseHook

    hook = WarehouseHook("onceflow_warehouse_bq")
    assert hook.is_bigquery
    lease = audit_store(tmp_path).acquire_lease(DAY, run_id="r", try_number=1)
    job = hook.overwrite_bigquery_partition(
        table="daily_sales", lease=lease, rows=RESULT.rows, dataset="sales"
    )

    load, swap = bigquery_stub.received
    staging_id = f"daily_sales__onceflow_stage_20241027_t{lease.fence_token}"
    assert load["configuration"]["load"]["destinationTable"] == {
        "projectId": PROJECT, "datasetId": "sales", "tableId": staging_id,
    }  # fmt: skip
    assert load["configuration"]["load"]["writeDisposition"] == "WRITE_TRUNCATE"
    script = swap["configuration"]["query"]["query"]
    assert script.index("BEGIN TRANSACTION") < script.index("RAISE") < script.index("DELETE FROM")
    assert script.index("DELETE FROM") < script.index("INSERT INTO") < script.index("COMMIT TRANSACTION")
    params = {
        p["name"]: p["parameterValue"]["value"] for p in swap["configuration"]["query"]["queryParameters"]
    }
    assert (params["fence_token"], params["day"], params["partition_key"]) == (
        str(lease.fence_token),
        "2024-10-27",
        "2024-10-27",
    )
    assert rows_checksum(bigquery_stub.partition_rows(TARGET, DAY)) == rows_checksum(
        [tuple(r) for r in RESULT.rows.itertuples(index=False)]
    )
    assert f"{PROJECT}.sales.{staging_id}" not in bigquery_stub.tables  # dropped after the commit
    assert (job["destination"], job["output_rows"]) == (TARGET, len(RESULT.rows))


def test_the_operator_loads_bigquery_and_audits_in_sql(bigquery_stub: BigQueryStub, tmp_path: Path) -> None:
    out = load_op(stage(tmp_path, "stage", RESULT), ledger_conn_id=None).execute(context("scheduled__x"))
    audit = audit_store(tmp_path).audit(DAY)
    assert audit is not None
    assert (audit.row_count, audit.checksum, audit.run_id) == (
        len(RESULT.rows),
        out["checksum"],
        "scheduled__x",
    )
    assert rows_checksum(bigquery_stub.partition_rows(TARGET, DAY)) == audit.checksum


def test_a_stalled_writer_that_wakes_after_a_newer_commit_is_refused_by_bigquery(
    bigquery_stub: BigQueryStub, tmp_path: Path
) -> None:
    """A passes every check and stalls before its write reaches BigQuery; B takes over, loads
    and audits; A wakes. BigQuery must keep B's rows under B's audit.

    Warehouse-lease mode with a zero-length lease lets B take over while A's thread is blocked
    (a ledger lease would be heartbeated by A's live thread; a real stall stops the heartbeat).
    """
    from onceflow.sales.partition_store import StaleAttemptError

    release = bigquery_stub.hold_next_write()
    a_folder, b_folder = stage(tmp_path, "a", NIGHTLY), stage(tmp_path, "b", RESULT)
    outcome: dict[str, BaseException | None] = {}

    def run_a() -> None:
        try:
            load_op(a_folder, ledger_conn_id=None, lease_seconds=0).execute(context("scheduled__a"))
            outcome["a"] = None
        except BaseException as exc:
            outcome["a"] = exc

    a = threading.Thread(target=run_a)
    a.start()
    assert bigquery_stub.wait_until_held(timeout=120), "A never reached BigQuery"
    out_b = load_op(b_folder, ledger_conn_id=None, lease_seconds=0).execute(context("manual__b"))
    release.set()
    a.join(timeout=120)
    assert not a.is_alive()

    assert isinstance(outcome["a"], StaleAttemptError), outcome["a"]
    audit = audit_store(tmp_path).audit(DAY)
    assert audit is not None and (audit.run_id, audit.checksum) == ("manual__b", out_b["checksum"])
    assert rows_checksum(bigquery_stub.partition_rows(TARGET, DAY)) == audit.checksum


@pytest.mark.parametrize("failing", ["load", "query"])
def test_a_failed_job_changes_neither_bigquery_nor_the_audit(
    bigquery_stub: BigQueryStub, tmp_path: Path, failing: str
) -> None:
    from google.api_core.exceptions import GoogleAPICallError

    first = load_op(stage(tmp_path, "first", NIGHTLY), ledger_conn_id=None).execute(context("scheduled__1"))
    bigquery_stub.fail_next(failing)
    with pytest.raises(GoogleAPICallError, match="the stub failed this job"):
        load_op(stage(tmp_path, "second", RESULT), ledger_conn_id=None).execute(context("manual__2"))
    audit = audit_store(tmp_path).audit(DAY)
    assert audit is not None and (audit.run_id, audit.checksum) == ("scheduled__1", first["checksum"])
    assert rows_checksum(bigquery_stub.partition_rows(TARGET, DAY)) == first["checksum"]
    assert not [t for t in bigquery_stub.tables if "__onceflow_stage_" in t]  # no staging table left


def test_an_injection_shaped_dataset_is_refused_before_any_request(
    bigquery_stub: BigQueryStub, tmp_path: Path
) -> None:
    from onceflow.hooks.warehouse import WarehouseHook

    hook = WarehouseHook("onceflow_warehouse_bq")
    lease = audit_store(tmp_path).acquire_lease(DAY, run_id="r", try_number=1)
    with pytest.raises(InvalidNameError):
        hook.overwrite_bigquery_partition(
            table="daily_sales", lease=lease, rows=RESULT.rows, dataset="sales`; DROP SCHEMA x; --"
        )
    with pytest.raises(InvalidNameError):
        hook.overwrite_bigquery_partition(table="daily$sales", lease=lease, rows=RESULT.rows, dataset="sales")
    assert bigquery_stub.received == []


def test_bigquery_refuses_an_extract_older_than_the_one_it_holds(
    bigquery_stub: BigQueryStub, tmp_path: Path
) -> None:
    from onceflow.hooks.warehouse import WarehouseHook
    from onceflow.sales.partition_store import OlderExtractError

    hook, store = WarehouseHook("onceflow_warehouse_bq"), audit_store(tmp_path)
    late, early = dt.datetime(2024, 10, 28, 9, 30), dt.datetime(2024, 10, 27, 23, 5)
    newer = store.acquire_lease(DAY, run_id="reprocess", try_number=1, lease_seconds=0)
    hook.overwrite_bigquery_partition(
        table="daily_sales", lease=newer, rows=RESULT.rows, dataset="sales", source_watermark_utc=late
    )
    stale = store.acquire_lease(
        DAY, run_id="scheduled", try_number=2, lease_seconds=0
    )  # newer token, older data
    with pytest.raises(OlderExtractError, match="onceflow-older-extract"):
        hook.overwrite_bigquery_partition(
            table="daily_sales", lease=stale, rows=NIGHTLY.rows, dataset="sales", source_watermark_utc=early
        )
    assert rows_checksum(bigquery_stub.partition_rows(TARGET, DAY)) == rows_checksum(
        [tuple(r) for r in RESULT.rows.itertuples(index=False)]
    )
    assert not [t for t in bigquery_stub.tables if "__onceflow_stage_" in t]


# A load attempt in its own process: stage the rows, then (with "kill") SIGKILL itself between the
# staging load job and the swap, as a worker killed at that point would.
_ATTEMPT = """
import datetime as dt, os, signal, sys
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery
from onceflow.sales.bigquery import fenced_overwrite
from onceflow.sales.fencing import Lease
from onceflow.sales.generator import GeneratorConfig
from onceflow.testing.sales_fixtures import clean_day

day = dt.date(2024, 10, 27)
token, mode = int(sys.argv[1]), sys.argv[2]
client = bigquery.Client(project="onceflow-test", credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": os.environ["BIGQUERY_EMULATOR_HOST"]})

def crash(stage):
    if mode == "kill" and stage == "staged":
        os.kill(os.getpid(), signal.SIGKILL)

fenced_overwrite(client, dataset="sales", table="daily_sales",
                 lease=Lease("daily_sales", day, token, f"run_{token}", 1, dt.datetime(2030, 1, 1)),
                 rows=clean_day(day, GeneratorConfig(seed=4, orders_per_day=40)).rows,
                 source_watermark_utc=dt.datetime(2024, 10, 28, 9), checkpoint=crash)
"""


def test_a_staging_table_left_by_an_attempt_killed_before_its_swap_is_dropped_by_the_next_commit(
    bigquery_stub: BigQueryStub,
) -> None:
    """kill -9 between the staging load job and the swap: the dead attempt's staging table (named
    by its token, so never reused) must not stay in the dataset for good."""
    import os
    import subprocess
    import sys

    def attempt(token: int, mode: str) -> int:
        env = {**os.environ, "BIGQUERY_EMULATOR_HOST": bigquery_stub.url}
        proc = subprocess.run([sys.executable, "-c", _ATTEMPT, str(token), mode], env=env, timeout=300)
        return proc.returncode

    assert attempt(1, "kill") == -9
    dead = f"{PROJECT}.sales.daily_sales__onceflow_stage_20241027_t1"
    assert dead in bigquery_stub.tables  # staged, never swapped
    assert attempt(2, "load") == 0
    assert rows_checksum(bigquery_stub.partition_rows(TARGET, DAY)) == rows_checksum(
        [tuple(r) for r in RESULT.rows.itertuples(index=False)]
    )
    assert not [t for t in bigquery_stub.tables if "__onceflow_stage_" in t]


def test_rows_of_another_day_are_refused_before_any_job(bigquery_stub: BigQueryStub, tmp_path: Path) -> None:
    """The swap deletes one day and inserts every staged row: a row of another day would be added
    to that day's partition beside its rows. Refused as the SQL overwrite refuses it."""
    from onceflow.hooks.warehouse import WarehouseHook

    lease = audit_store(tmp_path).acquire_lease(DAY, run_id="r", try_number=1)
    rows = RESULT.rows.copy()
    rows.loc[0, "partition_date"] = DAY + dt.timedelta(days=1)
    with pytest.raises(
        ValueError, match=r"rows for partitions \['2024-10-28'\] in a load of partition 2024-10-27"
    ):
        WarehouseHook("onceflow_warehouse_bq").overwrite_bigquery_partition(
            table="daily_sales", lease=lease, rows=rows, dataset="sales"
        )
    assert bigquery_stub.received == []
