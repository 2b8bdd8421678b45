"""daily_sales end to end with ``dag.test()``: real metadata DB, real shop and warehouse databases.

The run for local day D is the run whose data interval is [D 00:00, D+1 00:00) in
Europe/Amsterdam; ``dag.test(logical_date=D+1 00:00)`` infers exactly that interval the way a
manual trigger does.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
from typing import TYPE_CHECKING, Any

import pendulum
import pytest

from onceflow.sales.checksum import rows_checksum
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionStore, frame_records
from onceflow.sales.schema import SALES_COLUMNS
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from onceflow.ledger import Ledger
    from onceflow.testing.gcs_fixtures import FakeGcs

AMS = "Europe/Amsterdam"
CONFIG = GeneratorConfig(seed=21, orders_per_day=80)


def ledger_of(env: dict[str, str]) -> Ledger:
    from onceflow.ledger import Ledger, create_ledger_engine

    return Ledger(create_ledger_engine(env["ledger"]))


def run_day(run_dag: Callable[..., Any], day: dt.date) -> Any:
    """Run daily_sales for local ``day`` (logical date D+1 00:00 infers the interval [D, D+1)).

    The DAG's deadline alert is dropped from the in-memory copy: ``dag.test()`` in Airflow 3.3.2
    deserializes the DAG without the metadata DB and then looks its encoded alerts up as alert
    ids when the run succeeds (``'dict' object has no attribute 'hex'``). The alert itself is
    tested with the real scheduler (tests/acceptance/test_deadline_scheduler.py).
    """
    from onceflow.testing.dag_runner import load_dag

    dag = load_dag("daily_sales")
    dag.deadline = None
    nxt = day + dt.timedelta(days=1)
    return run_dag(dag, logical_date=pendulum.datetime(nxt.year, nxt.month, nxt.day, tz=AMS))


def asset_event_extras(run_id: str) -> list[dict[str, Any]]:
    """Extras of the events of ``x-onceflow://warehouse/daily_sales`` emitted by one run."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        stmt = (
            select(AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.uri == "x-onceflow://warehouse/daily_sales", AssetEvent.source_run_id == run_id)
        )
        return [dict(e) for e in session.scalars(stmt)]


def count_messages(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts, by type, the messages tasks send their supervisor (under dag.test(): in process)."""
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    sent: collections.Counter[str] = collections.Counter()
    real = InProcessSupervisorComms.send

    def send(self: Any, msg: Any) -> Any:
        sent[type(msg).__name__] += 1
        return real(self, msg)

    monkeypatch.setattr(InProcessSupervisorComms, "send", send)
    return sent


def store_of(url: str) -> PartitionStore:
    return PartitionStore(make_engine(url), "daily_sales")


@pytest.mark.parametrize(
    ("day", "hours"),
    [(dt.date(2024, 3, 31), 23), (dt.date(2024, 10, 27), 25), (dt.date(2024, 6, 15), 24)],
)
def test_the_run_for_day_d_loads_exactly_the_orders_of_local_day_d(
    monkeypatch: pytest.MonkeyPatch,
    run_dag: Callable[..., Any],
    shop_orders: Callable[..., Any],
    daily_sales_env: dict[str, str],
    day: dt.date,
    hours: int,
) -> None:
    shop_orders(
        daily_sales_env["shop"], day - dt.timedelta(days=3), day + dt.timedelta(days=2), **vars(CONFIG)
    )
    sent = count_messages(monkeypatch)
    result = run_day(run_dag, day)
    assert result.state == "success", result.ti_states
    assert result.data_interval_end - result.data_interval_start == dt.timedelta(hours=hours)
    # Each message is an Execution API round trip: one return value per task, and no XCom pull
    # (every task finds the partition and the staging folder from its run; issue 27).
    assert sorted(result.xcoms) == [(t, "return_value") for t in ("clean", "extract", "load")]
    assert sent["SetXCom"] == 3 and sent["GetXCom"] == 0, dict(sent)

    store = store_of(daily_sales_env["warehouse"])
    rows = store.partition_rows(day)
    ids = {r[1] for r in rows}
    prefix, nxt = f"O{day:%Y%m%d}-", f"O{day + dt.timedelta(days=1):%Y%m%d}-"
    assert f"{prefix}00000" in ids  # sold at D 00:00:00 local: the interval includes its start
    assert f"{prefix}00001" in ids  # sold at D+1 00:00 minus 1 µs
    assert f"{nxt}00000" not in ids  # sold at D+1 00:00:00: the interval excludes its end
    expected = clean_day(day, CONFIG)
    assert store.partition_checksum(day) == rows_checksum(frame_records(expected.rows, SALES_COLUMNS))
    audit = store.audit(day)
    assert audit is not None and audit.row_count == len(expected.rows) > 0
    assert audit.reject_count == len(expected.rejects)
    assert result.xcom("load")["checksum"] == audit.checksum
    # The load updated the table's Asset (sales_dashboard is scheduled on it), naming the partition.
    assert asset_event_extras(result.run_id) == [
        {
            "table": "daily_sales",
            "partition": day.isoformat(),
            "row_count": audit.row_count,
            "checksum": audit.checksum,
        }
    ]


def test_a_rerun_is_byte_identical(
    run_dag: Callable[..., Any], shop_orders: Callable[..., Any], daily_sales_env: dict[str, str]
) -> None:
    day = dt.date(2024, 10, 27)
    shop_orders(
        daily_sales_env["shop"], day - dt.timedelta(days=3), day + dt.timedelta(days=2), **vars(CONFIG)
    )
    first = run_day(run_dag, day)
    store = store_of(daily_sales_env["warehouse"])
    before = (store.audit(day), store.partition_rows(day), store.partition_rejects(day))
    second = run_day(run_dag, day)
    assert first.state == second.state == "success"
    after = (store.audit(day), store.partition_rows(day), store.partition_rejects(day))
    assert after[1:] == before[1:]
    assert after[0].checksum == before[0].checksum  # type: ignore[union-attr]
    assert after[0].fence_token > before[0].fence_token  # type: ignore[union-attr]

    # The work ledger: one partition_load item, done, its result the partition's checksum; the
    # re-run re-opened it (recheck) and committed under the next fencing token.
    ledger = ledger_of(daily_sales_env)
    item = ledger.item("daily_sales/2024-10-27")
    assert (item.kind, item.state, item.fencing_token) == ("partition_load", "done", after[0].ledger_token)  # type: ignore[union-attr]
    [result] = ledger.results("daily_sales/2024-10-27")
    assert result.payload["checksum"] == after[0].checksum == store.partition_checksum(day)  # type: ignore[union-attr]
    assert result.payload["row_count"] == len(after[1]) and result.fencing_token == item.fencing_token
    events = [(t.event, t.to_state) for t in ledger.history(item.work_key)]
    assert events == [("create", "pending"), ("claim", "leased"), ("complete", "done"),
                      ("recheck", "pending"), ("claim", "leased"), ("complete", "done")]  # fmt: skip
    assert {t.owner for t in ledger.history(item.work_key) if t.event == "complete"} == {
        f"daily_sales/{first.run_id}/1",
        f"daily_sales/{second.run_id}/1",
    }


def test_an_empty_day_loads_an_empty_partition(
    run_dag: Callable[..., Any], shop_orders: Callable[..., Any], daily_sales_env: dict[str, str]
) -> None:
    shop_orders(daily_sales_env["shop"], dt.date(2024, 1, 1), dt.date(2024, 1, 2), **vars(CONFIG))
    result = run_day(run_dag, dt.date(2024, 2, 1))
    assert result.state == "success", result.ti_states
    audit = store_of(daily_sales_env["warehouse"]).audit(dt.date(2024, 2, 1))
    assert audit is not None and (audit.row_count, audit.reject_count) == (0, 0)


def test_a_day_whose_source_query_fails_loads_nothing(
    run_dag: Callable[..., Any], daily_sales_env: dict[str, str]
) -> None:
    # The shop database exists but has no orders table: the extract query fails.
    result = run_day(run_dag, dt.date(2024, 2, 1))
    assert result.state == "failed"
    assert result.ti_states["extract"] == "failed"
    assert result.ti_states["load"] == "upstream_failed"
    store = store_of(daily_sales_env["warehouse"])
    store.create_schema()
    assert store.audit(dt.date(2024, 2, 1)) is None


def test_too_many_rejects_fail_the_run_and_leave_the_partition_but_record_the_reasons(
    run_dag: Callable[..., Any],
    shop_orders: Callable[..., Any],
    daily_sales_env: dict[str, str],
) -> None:
    day = dt.date(2024, 5, 6)
    shop_orders(
        daily_sales_env["shop"],
        day,
        day + dt.timedelta(days=1),
        seed=1,
        orders_per_day=4,
        malformed_per_day=6,
    )
    result = run_day(run_dag, day)
    assert result.state == "failed"
    assert result.ti_states["load"] == "failed"
    store = store_of(daily_sales_env["warehouse"])
    assert store.audit(day) is None
    assert store.partition_rows(day) == []
    item = ledger_of(daily_sales_env).item("daily_sales/2024-05-06")
    assert item.state == "needs_correction" and "rejected" in (item.last_error or "")
    assert {r["reason"] for r in store.partition_rejects(day)} == {
        "missing_order_id",
        "unknown_event_type",
        "missing_refund_id",
        "bad_amount",
        "non_positive_amount",
        "unknown_currency",
    }


def test_an_injection_shaped_table_name_in_configuration_is_refused(
    monkeypatch: pytest.MonkeyPatch, daily_sales_env: dict[str, str]
) -> None:
    from onceflow.testing.dag_runner import load_dag

    monkeypatch.setenv("ONCEFLOW_SALES_TABLE", "daily_sales; DROP TABLE load_audit")
    with pytest.raises(KeyError, match="refusing table name"):
        load_dag("daily_sales")


# -- staging through onceflow_storage (no shared disk between workers) -----------------------------

STAGED = {
    "text": ["extract.tsv", "manifest.json", "rejects.tsv", "rows.tsv"],
    "parquet": ["extract.parquet", "manifest.json", "rejects.parquet", "rows.parquet"],
}


def local_files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


@pytest.mark.parametrize("staging_format", ["text", "parquet"])
def test_a_run_stages_through_onceflow_storage_in_a_bucket_and_writes_no_local_file(
    run_dag: Callable[..., Any],
    shop_orders: Callable[..., Any],
    daily_sales_env: dict[str, str],
    fake_gcs: FakeGcs,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    staging_format: str,
) -> None:
    """The workers of a Celery cluster share no disk: extract, clean and load hand the day over
    through the bucket of ``onceflow_storage``, never through a folder on the worker; the day
    staged as text (the default for its size) and as parquet."""
    from pathlib import Path

    from onceflow.sales.text_staging import TEXT_ROWS_ENV

    if staging_format == "parquet":
        monkeypatch.setenv(TEXT_ROWS_ENV, "0")

    day = dt.date(2024, 10, 27)
    shop_orders(
        daily_sales_env["shop"], day - dt.timedelta(days=3), day + dt.timedelta(days=2), **vars(CONFIG)
    )
    bucket = fake_gcs.bucket()
    monkeypatch.delenv("ONCEFLOW_SALES_STAGING_DIR")  # set by sales_connections: the default now
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_STORAGE", fake_gcs.connection_json(base=f"gs://{bucket}/steps"))
    onceflow_home = Path(os.environ["AIRFLOW_HOME"]) / "onceflow"
    local_before = local_files(onceflow_home / "staging") | local_files(onceflow_home / "storage")

    result = run_day(run_dag, day)

    assert result.state == "success", result.ti_states
    store = store_of(daily_sales_env["warehouse"])
    audit = store.audit(day)
    expected = clean_day(day, CONFIG)
    assert audit is not None and audit.row_count == len(expected.rows) > 0
    assert store.partition_checksum(day) == rows_checksum(frame_records(expected.rows, SALES_COLUMNS))
    assert audit.checksum == store.partition_checksum(day) == result.xcom("load")["checksum"]
    # the staged objects are in the bucket, under <base>/sales-staging/<dag>/<day>/<run key>/
    uri = result.xcom("extract")["staging_dir"]
    assert result.xcom("clean")["staging_dir"] == uri
    assert uri.startswith(f"gs://{bucket}/steps/sales-staging/daily_sales/2024-10-27/")
    key = uri.removeprefix(f"gs://{bucket}/")
    objects = fake_gcs.objects(bucket)
    assert sorted(objects) == [f"{key}/{name}" for name in STAGED[staging_format]]
    manifest = json.loads(objects[f"{key}/manifest.json"])
    assert (manifest["rows"], manifest["rejects"]) == (audit.row_count, audit.reject_count)
    assert manifest["format"] == staging_format
    # and nothing on the worker's disk: not the old default folder, not the local storage default
    after = local_files(onceflow_home / "staging") | local_files(onceflow_home / "storage")
    assert after == local_before, sorted(after - local_before)
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("s3x://foo", r"ONCEFLOW_SALES_STAGING_DIR must start with file:/// or gs://, got 's3x://foo'"),
        ("relative/staging", r"ONCEFLOW_SALES_STAGING_DIR must be an absolute path .* 'relative/staging'"),
        ("gs://", r"ONCEFLOW_SALES_STAGING_DIR must be gs://bucket/prefix, got 'gs://'"),
        ("file://host/x", r"ONCEFLOW_SALES_STAGING_DIR must be an absolute file URI"),
    ],
)
def test_a_bad_staging_setting_fails_the_extract_naming_the_variable(
    value: str,
    message: str,
    shop_orders: Callable[..., Any],
    daily_sales_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from onceflow.sales.partitions import day_bounds_utc
    from onceflow.testing.dag_runner import load_dag

    day = dt.date(2024, 6, 15)
    shop_orders(
        daily_sales_env["shop"], day - dt.timedelta(days=3), day + dt.timedelta(days=1), **vars(CONFIG)
    )
    monkeypatch.setenv("ONCEFLOW_SALES_STAGING_DIR", value)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    dag = load_dag("daily_sales")
    extract: Any = dag.task_dict["extract"]
    start, end = (pendulum.instance(b) for b in day_bounds_utc(day, AMS))
    context = {"data_interval_start": start, "data_interval_end": end, "dag": dag, "run_id": "manual__bad"}

    with pytest.raises(AirflowFailException, match=message):  # no retries: waiting will not fix it
        extract.python_callable(**context)
    assert list(cwd.iterdir()) == []  # nothing staged relative to the worker's working directory


def test_a_run_with_a_bad_staging_setting_fails_at_extract_and_loads_nothing(
    run_dag: Callable[..., Any],
    shop_orders: Callable[..., Any],
    daily_sales_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    day = dt.date(2024, 6, 15)
    shop_orders(
        daily_sales_env["shop"], day - dt.timedelta(days=3), day + dt.timedelta(days=1), **vars(CONFIG)
    )
    monkeypatch.setenv("ONCEFLOW_SALES_STAGING_DIR", "s3x://foo")
    result = run_day(run_dag, day)
    assert result.state == "failed"
    assert (result.ti_states["extract"], result.ti_states["load"]) == ("failed", "upstream_failed")
    store = store_of(daily_sales_env["warehouse"])
    store.create_schema()
    assert store.audit(day) is None
