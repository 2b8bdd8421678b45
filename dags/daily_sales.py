"""daily_sales: one business day of shop orders -> cleaned -> one warehouse partition, exactly once.

See docs/daily-sales.md. Parse time only builds the DAG: no connections, no pandas, no I/O.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pendulum
from airflow.sdk import dag, task

from onceflow.compat import CronDataIntervalTimetable
from onceflow.notifications.deadline import daily_load_deadline
from onceflow.operators.partition import PartitionOverwriteOperator
from onceflow.priority import RecentFirstWeightStrategy
from onceflow.sales.config import SalesConfig

CONFIG = SalesConfig.from_env()


def sales_partition(start: dt.datetime, end: dt.datetime) -> str:
    """The run's business day from its data interval (a template macro: no XCom pull needed)."""
    from onceflow.sales.partitions import partition_for_interval

    return partition_for_interval(start, end, CONFIG.timezone).isoformat()


POOL = "onceflow_warehouse"
SALES_ASSET = CONFIG.asset()

DOC = f"""
### daily_sales

Copies the orders of one **business day** (`{CONFIG.timezone}`) out of `onceflow_shop_db`, cleans
them (dedupe, net refunds, currency to {CONFIG.reporting_currency}, malformed rows to `rejects`) and
overwrites exactly that day's partition of `{CONFIG.table}` in `onceflow_warehouse`, audited in
`load_audit`. The load leases the work ledger item `{CONFIG.table}/<day>` (`onceflow_ledger`); the
warehouse refuses an attempt whose ledger fencing token is older than one it already saw, and the
result (row count, checksum) is committed to the ledger after the warehouse commit. The run for day D has the data interval [D 00:00, D+1 00:00) local time and
starts at D+1 00:00. Re-running, retrying or backfilling any day gives the same partition.

Backfill: `airflow backfill create --dag-id daily_sales --from-date 2024-01-01 --to-date 2025-12-31
--max-active-runs 4` (Airflow 3 removed `airflow dags backfill`).
"""


@dag(
    dag_id="daily_sales",
    # A data-interval timetable: a plain "0 0 * * *" gives zero-length intervals in Airflow 3.
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone=CONFIG.timezone),
    start_date=pendulum.datetime(
        CONFIG.start_date.year, CONFIG.start_date.month, CONFIG.start_date.day, tz=CONFIG.timezone
    ),
    catchup=False,
    max_active_runs=4,
    max_active_tasks=8,
    default_args={
        "owner": "data-eng",
        "retries": CONFIG.retries,
        "retry_delay": dt.timedelta(minutes=5),
        "pool": POOL,
        # Newest data first when waiting for pool slots: tonight, then the newest backfill days.
        "weight_rule": RecentFirstWeightStrategy(),
    },
    tags=["onceflow", "sales", "warehouse"],
    user_defined_macros={"sales_partition": sales_partition},
    doc_md=DOC,
    # Alert (MissedDeadlineNotifier) when day D is not loaded by 07:00 business time on D+1.
    deadline=daily_load_deadline(business_timezone=CONFIG.timezone),
)
def daily_sales() -> None:
    # Every task finds the run's partition (from the data interval) and staging folder
    # (staging.run_dir) itself: no XCom pulls, and one return value each (multiple_outputs=False:
    # a dict return would otherwise be pushed key by key, one Execution API call per key).
    @task(execution_timeout=CONFIG.task_timeout, multiple_outputs=False)  # statements have deadlines too
    def extract(**context: Any) -> dict[str, Any]:
        """Read the orders of the run's data interval [start, end) into the run's staging folder."""
        from onceflow.compat import AirflowFailException
        from onceflow.hooks.storage import StorageHook
        from onceflow.hooks.warehouse import ShopDbHook
        from onceflow.objects import StorageUriError
        from onceflow.sales import staging
        from onceflow.sales.partitions import partition_for_interval

        start, end = context["data_interval_start"], context["data_interval_end"]
        day = partition_for_interval(start, end, CONFIG.timezone)
        try:  # before the shop is read: a wrong setting will not fix itself on retry
            base = StorageHook().sales_staging()
        except StorageUriError as exc:
            raise AirflowFailException(str(exc)) from exc
        folder = staging.run_dir(base, context["dag"].dag_id, day, context["run_id"])
        # The rows and the shop's clock from one snapshot (the load refuses an older extract),
        # streamed from a server-side cursor into parquet row groups: one batch in memory.
        with ShopDbHook().stream_interval(start, end) as (watermark, batches):
            _path, rows = staging.write_extract_stream(folder, batches, source_watermark_utc=watermark)
        # For the UI: the folder's URI (file:// or gs://); clean and load find it themselves.
        return {"partition": day.isoformat(), "staging_dir": staging.folder_uri(folder), "source_rows": rows}

    @task(execution_timeout=CONFIG.task_timeout, multiple_outputs=False)
    def clean(**context: Any) -> dict[str, Any]:
        """Clean the staged orders; rows and rejects go back to the same staging folder."""
        from onceflow.hooks.storage import StorageHook
        from onceflow.sales import staging
        from onceflow.sales.clean_rules import PROCESSING_VERSION
        from onceflow.sales.partitions import partition_for_interval

        start, end = context["data_interval_start"], context["data_interval_end"]
        day = partition_for_interval(start, end, CONFIG.timezone)
        folder = staging.run_dir(StorageHook().sales_staging(), context["dag"].dag_id, day, context["run_id"])
        # Rows and watermark from one open file (an overlapping extract try cannot mix them), read
        # row group by row group and cleaned bucket by bucket: memory does not grow with the day.
        result = staging.clean_extract(
            folder,
            partition=day,
            processing_version=PROCESSING_VERSION,
            reporting_currency=CONFIG.reporting_currency,
        )
        return {
            "partition": day.isoformat(),
            "staging_dir": staging.folder_uri(folder),
            "source_rows": result.source_rows,
            "rows": result.rows,
            "rejects": result.rejects,
            "duplicates_dropped": result.duplicates_dropped,
            "reasons": result.reasons,
        }

    load = PartitionOverwriteOperator(
        task_id="load",
        table=CONFIG.table,
        partition="{{ sales_partition(data_interval_start, data_interval_end) }}",
        staging_dir=None,  # the run's own folder, staging.run_dir
        max_reject_ratio=CONFIG.max_reject_ratio,
        execution_timeout=CONFIG.task_timeout,
        outlets=[SALES_ASSET],
    )
    extract() >> clean() >> load


daily_sales()
