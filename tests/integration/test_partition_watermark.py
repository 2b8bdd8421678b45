"""The newest extract wins: a load never replaces a partition with rows read from the shop earlier.

Tokens follow lease order, not data age. The interleaving of issue 12: the nightly run extracts
before late rows arrive and loads; a reprocess extracts later (late rows included) and loads more
rows; the nightly run's load is cleared and retried from its old staged extract under a newer
token. The retry must be refused, the partition keep the reprocess's rows. Real shop, warehouse
(SQLite and PostgreSQL) and ledger databases; the runs are ``dag.test()`` runs of daily_sales.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import types
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pendulum
import pytest

from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.sales.partition_store import PartitionStore
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

AMS = "Europe/Amsterdam"
DAY = dt.date(2024, 10, 27)
CONFIG = GeneratorConfig(seed=31, orders_per_day=80, late_rate=0.1)
# The nightly run read the shop at 00:05 on D+1 (23:05 UTC on this 25-hour day).
NIGHTLY_CUTOFF = dt.datetime(2024, 10, 27, 23, 5)
EARLY = dt.datetime(2024, 10, 27, 23, 5)
LATER = dt.datetime(2024, 10, 28, 9, 30)


@pytest.fixture
def store(sales_db_url: str) -> Iterator[PartitionStore]:
    engine = make_engine(sales_db_url)
    s = PartitionStore(engine, "daily_sales")
    s.create_schema()
    yield s
    engine.dispose()


def test_an_extract_older_than_the_committed_one_is_refused(store: PartitionStore) -> None:
    from onceflow.sales.partition_store import OlderExtractError

    nightly = clean_day(DAY, CONFIG, ingested_before=NIGHTLY_CUTOFF)
    complete = clean_day(DAY, CONFIG)
    lease = store.acquire_lease(DAY, run_id="reprocess", try_number=1)
    store.overwrite(
        lease, complete.rows, None, processing_version=PROCESSING_VERSION, source_watermark_utc=LATER
    )

    stale = store.acquire_lease(DAY, run_id="scheduled", try_number=2, lease_seconds=0)  # a newer token...
    with pytest.raises(OlderExtractError, match=r"read the shop at 2024-10-27 23:05:00 UTC.*run 'reprocess'"):
        store.overwrite(
            stale, nightly.rows, None, processing_version=PROCESSING_VERSION, source_watermark_utc=EARLY
        )
    with pytest.raises(OlderExtractError, match="an unknown time"):  # ...or no watermark at all
        store.overwrite(stale, nightly.rows, None, processing_version=PROCESSING_VERSION)
    audit = store.audit(DAY)
    assert audit is not None and (audit.run_id, audit.source_watermark_utc) == ("reprocess", LATER)
    assert store.partition_checksum(DAY) == audit.checksum

    # The same extract again (a retry of the reprocess) or a newer one still loads.
    again = store.acquire_lease(DAY, run_id="reprocess", try_number=2)
    store.overwrite(
        again, complete.rows, None, processing_version=PROCESSING_VERSION, source_watermark_utc=LATER
    )


def write_shop(url: str, *, late: bool) -> None:
    rows = generate_orders(DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=2), CONFIG)
    rows = [r for r in rows if (r.ingested_at_utc >= NIGHTLY_CUTOFF) == late]
    engine = make_engine(url)
    try:
        write_orders(engine, rows)
    finally:
        engine.dispose()


def run_day(run_dag: Callable[..., Any]) -> Any:
    from onceflow.testing.dag_runner import load_dag

    dag = load_dag("daily_sales")
    dag.deadline = None  # dag.test() of a DAG with a deadline crashes in Airflow 3.3.2 (see test_sales_dag)
    return run_dag(dag, logical_date=pendulum.datetime(2024, 10, 28, tz=AMS))


def test_a_retried_nightly_load_of_an_old_extract_cannot_replace_a_newer_reprocess(
    run_dag: Callable[..., Any], daily_sales_env: dict[str, str], tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.operators.partition import PartitionOverwriteOperator

    write_shop(daily_sales_env["shop"], late=False)  # the shop at 00:05: late rows not there yet
    nightly = run_day(run_dag)
    assert nightly.state == "success", nightly.ti_states
    # The nightly run's own staging folder as it was (in production its run id differs from the
    # reprocess's, so the reprocess never touches it).
    nightly_folder = tmp_path / "nightly_staging"
    staged_uri = nightly.xcom("extract")["staging_dir"]  # file:// (ONCEFLOW_SALES_STAGING_DIR is local)
    assert staged_uri.startswith("file:///")
    shutil.copytree(urlsplit(staged_uri).path, nightly_folder)

    write_shop(daily_sales_env["shop"], late=True)  # the late rows arrive
    reprocess = run_day(run_dag)
    assert reprocess.state == "success", reprocess.ti_states
    store = PartitionStore(make_engine(daily_sales_env["warehouse"]), "daily_sales")
    after_reprocess = store.audit(DAY)
    assert after_reprocess is not None
    assert after_reprocess.row_count > nightly.xcom("load")["row_count"]  # the late rows made it in

    # The nightly run's load is cleared and retried: its old extract under a newer ledger token.
    retry = PartitionOverwriteOperator(
        task_id="load", partition=DAY.isoformat(), staging_dir=str(nightly_folder)
    )
    context: Any = {"run_id": nightly.run_id, "ti": types.SimpleNamespace(try_number=2, dag_id="daily_sales")}
    with pytest.raises(AirflowFailException, match=r"which is newer\. Clear this run's extract task"):
        retry.execute(context)

    audit = store.audit(DAY)
    assert audit == after_reprocess
    assert store.partition_checksum(DAY) == audit.checksum
    assert audit.source_watermark_utc is not None
    ledger = Ledger(create_ledger_engine(daily_sales_env["ledger"]))
    assert ledger.item("daily_sales/2024-10-27").state == "done"
    [*_, latest] = ledger.results("daily_sales/2024-10-27")
    assert latest.payload["checksum"] == audit.checksum
    store.engine.dispose()


def test_through_the_ledger_an_older_extract_leaves_the_item_done_with_the_newer_load(
    ledger: Any, store: PartitionStore
) -> None:
    """The race the operator's early check cannot see: the newer extract commits in between."""
    from onceflow.sales.ledger_link import load_partition, work_key_for
    from onceflow.sales.partition_store import OlderExtractError

    complete = clean_day(DAY, CONFIG)

    def attempt(run_id: str, watermark: dt.datetime) -> Any:
        return load_partition(
            ledger, store, partition=DAY, owner=f"daily_sales/{run_id}/1", run_id=run_id, try_number=1,
            processing_version=PROCESSING_VERSION, lease_seconds=60,
            write=lambda lease: store.overwrite(
                lease, complete.rows, None, processing_version=PROCESSING_VERSION, source_watermark_utc=watermark
            ),
        )  # fmt: skip

    newer = attempt("reprocess", LATER)
    with pytest.raises(OlderExtractError):
        attempt("scheduled", EARLY)
    key = work_key_for("daily_sales", DAY)
    assert ledger.item(key).state == "done"
    latest = ledger.results(key)[-1]
    assert (latest.payload["run_id"], latest.payload["checksum"]) == ("reprocess", newer.checksum)


def test_an_older_extract_refused_for_its_rejects_leaves_the_newer_loads_rejects(
    store: PartitionStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sales_db_url: str
) -> None:
    """Too many rejects only records them (``record_rejects``), but an older extract must not.

    The nightly run's load (old extract, one more malformed row) passes the operator's early age
    check; the reprocess commits right then; the nightly load takes the newest token and, over the
    reject ratio, would replace the reprocess's rejects and the audit's reject count with its own.
    """
    import dataclasses

    import pandas as pd
    from airflow.sdk.exceptions import AirflowFailException

    from onceflow.operators.partition import PartitionOverwriteOperator
    from onceflow.sales import staging

    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE",
        json.dumps({"conn_type": "sqlite" if sales_db_url.startswith("sqlite") else "postgres",
                    "extra": {"sqlalchemy_url": sales_db_url}}),
    )  # fmt: skip
    complete = clean_day(DAY, CONFIG)
    nightly = clean_day(DAY, CONFIG, ingested_before=NIGHTLY_CUTOFF)
    extra = pd.DataFrame([{"source_row_id": 10**6, "order_id": "x", "reason": "bad_amount", "raw": "{}"}])
    nightly = dataclasses.replace(nightly, rejects=pd.concat([nightly.rejects, extra], ignore_index=True))
    folder = tmp_path / "nightly"
    source = staging.StagedExtract(pd.DataFrame(), EARLY, "nightly-extract")
    staging.write_clean(folder, nightly, partition=DAY, processing_version=PROCESSING_VERSION, source=source)

    real_check = PartitionStore.check_extract_age

    def check_then_reprocess_commits(self: PartitionStore, *args: Any, **kwargs: Any) -> None:
        real_check(self, *args, **kwargs)
        lease = store.acquire_lease(DAY, run_id="reprocess", try_number=1)
        store.overwrite(lease, complete.rows, complete.rejects, processing_version=PROCESSING_VERSION,
                        source_watermark_utc=LATER)  # fmt: skip

    monkeypatch.setattr(PartitionStore, "check_extract_age", check_then_reprocess_commits)
    load = PartitionOverwriteOperator(
        task_id="load", partition=DAY.isoformat(), staging_dir=str(folder), ledger_conn_id=None,
        max_reject_ratio=0.01,
    )  # fmt: skip
    context: Any = {"run_id": "scheduled", "ti": types.SimpleNamespace(try_number=2, dag_id="daily_sales")}
    with pytest.raises(AirflowFailException, match="which is newer"):
        load.execute(context)

    audit = store.audit(DAY)
    assert audit is not None and (audit.run_id, audit.reject_count) == ("reprocess", len(complete.rejects))
    stored = [r["source_row_id"] for r in store.partition_rejects(DAY)]
    assert stored == sorted(complete.rejects["source_row_id"].tolist())
