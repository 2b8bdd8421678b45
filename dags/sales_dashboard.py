"""sales_dashboard: re-render the finance dashboard whenever daily_sales commits a partition.

See docs/dashboard-and-deadlines.md. Parse time only builds the DAG: matplotlib, the warehouse
connection and the query all live inside the task.
"""

from __future__ import annotations

import datetime as dt
import os

import pendulum
from airflow.sdk import dag

from onceflow.operators.dashboard import SalesDashboardOperator
from onceflow.priority import AHEAD_OF_RECENT_FIRST
from onceflow.sales.config import SalesConfig

CONFIG = SalesConfig.from_env()
# The Asset that daily_sales' load task lists as its outlet (same name and URI).
SALES_ASSET = CONFIG.asset()
# Empty means $AIRFLOW_HOME/onceflow/dashboard, resolved when the task runs.
OUTPUT_DIR = os.environ.get("ONCEFLOW_DASHBOARD_DIR") or None

DOC = f"""
### sales_dashboard

Scheduled on the Asset `{SALES_ASSET.uri}`: every committed load of `{CONFIG.table}` queues a run
(Airflow folds events that arrive together into one run). The task reads `load_audit` and the
sales table from `onceflow_warehouse` and writes `index.html` and a PNG chart of the last 30 days
to `ONCEFLOW_DASHBOARD_DIR` (default `$AIRFLOW_HOME/onceflow/dashboard/`).

The first line of the page names the **newest complete day** (the newest partition in
`load_audit`), when it was loaded and by which run. Days of the window without a load are listed
and drawn as *not loaded*, never as zero sales. An empty warehouse gives a "No data" page.
"""


@dag(
    dag_id="sales_dashboard",
    schedule=[SALES_ASSET],
    start_date=pendulum.datetime(2023, 1, 1, tz="UTC"),
    catchup=False,
    # One render at a time; a render always reads the newest state, so queued events lose nothing.
    max_active_runs=1,
    default_args={
        "owner": "data-eng",
        "retries": 2,
        "retry_delay": dt.timedelta(minutes=1),
    },
    tags=["onceflow", "sales", "dashboard"],
    doc_md=DOC,
)
def sales_dashboard() -> None:
    SalesDashboardOperator(
        task_id="render",
        table=CONFIG.table,
        output_dir=OUTPUT_DIR,
        currency=CONFIG.reporting_currency,
        title="Daily sales",
        # A short read of the warehouse: it takes a warehouse slot ahead of the waiting loads,
        # whose recency weights (RecentFirstWeightStrategy) are in the tens of millions.
        pool="onceflow_warehouse",
        priority_weight=AHEAD_OF_RECENT_FIRST,
        weight_rule="absolute",
    )


sales_dashboard()
