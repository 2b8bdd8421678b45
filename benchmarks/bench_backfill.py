"""A 730-day backfill of daily_sales against the same backfill of an empty DAG: the per-run overhead.

Run: ``.venv/bin/python benchmarks/bench_backfill.py [--days N] [--quick]`` (PostgreSQL on
127.0.0.1:5432, or ``ONCEFLOW_TEST_DATABASE_URL``).

One real Airflow installation (PostgreSQL metadata DB, LocalExecutor, api-server, scheduler,
dag-processor, triggerer) holds two DAGs with the same timetable (daily, Europe/Amsterdam), the
same three tasks in the same pool ``onceflow_warehouse`` and the same ``deadline=``:

* ``daily_sales``: extract from the shop database, clean with pandas, fenced partition overwrite
  into the PostgreSQL warehouse;
* ``empty_daily``: three tasks that do nothing.

Each is backfilled over the same local days with ``airflow backfill create --max-active-runs``
and timed from the command to the scheduler marking the backfill complete. The same days are
also loaded day by day without Airflow (the work alone). Then daily_sales is backfilled again with
``--reprocess-behavior completed`` (skip with ``--no-reprocess``): every partition must be re-loaded
under a newer fence token with an unchanged checksum. Printed: wall times, seconds per run, the
ratios (how much of a daily_sales run is Airflow's per-run cost) and the two checksum verdicts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))

from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.testing import postgres
from onceflow.testing.sales_backfill import (
    create_backfill,
    day_by_day_pass,
    local_days,
    partition_audits,
    standalone_cluster,
    wait_for_backfill,
)

TZ = "Europe/Amsterdam"
DAGS = Path(__file__).resolve().parents[1] / "dags"

EMPTY_DAG = """
import pendulum
from airflow.sdk import CronDataIntervalTimetable, dag, task

from onceflow.notifications.deadline import daily_load_deadline


@dag(
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="Europe/Amsterdam"),
    start_date=pendulum.datetime(2099, 1, 1, tz="Europe/Amsterdam"),
    catchup=False,
    max_active_runs=4,
    tags=["benchmark"],
    doc_md="daily_sales' shape and settings with no work: the per-run cost of Airflow.",
    default_args={"owner": "onceflow", "retries": 0, "pool": "onceflow_warehouse"},
    deadline=daily_load_deadline(business_timezone="Europe/Amsterdam"),
)
def empty_daily():
    @task
    def extract() -> None:
        pass

    @task
    def clean() -> None:
        pass

    @task
    def load() -> None:
        pass

    extract() >> clean() >> load()


empty_daily()
"""


def timed_backfill(
    cluster: Any,
    dag_id: str,
    days: list[dt.date],
    max_active_runs: int,
    reprocess_behavior: str | None = None,
) -> float:
    """Seconds from ``airflow backfill create`` to the scheduler completing the backfill."""
    cluster.wait_for_dag(dag_id)
    started = time.monotonic()
    backfill = create_backfill(
        cluster,
        dag_id,
        days[0],
        days[-1],
        timezone=TZ,
        max_active_runs=max_active_runs,
        reprocess_behavior=reprocess_behavior,
    )
    runs = wait_for_backfill(cluster, backfill, timeout=12 * 3600, poll=5.0)
    elapsed = time.monotonic() - started
    print(f"  {dag_id} backfill {backfill}: {len(runs)} runs in {elapsed:.1f} s", flush=True)
    failed = [r["run_id"] for r in runs if r["state"] != "success"]
    if len(runs) != len(days) or failed:
        tis = cluster.query(
            "SELECT run_id, task_id, state FROM task_instance WHERE dag_id = :d AND state != 'success'",
            d=dag_id,
        )
        raise SystemExit(
            f"{dag_id}: {len(runs)} runs for {len(days)} days, failed: {failed[:5]}\n"
            f"unsuccessful tasks: {tis[:10]}\n{cluster.log_tails()}"
        )
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=730, help="local days to backfill (default 730)")
    parser.add_argument("--quick", action="store_true", help="30 days")
    parser.add_argument("--max-active-runs", type=int, default=8)
    parser.add_argument(
        "--no-reprocess", action="store_true", help="skip the --reprocess-behavior completed pass"
    )
    parser.add_argument("--slots", type=int, default=4, help="slots of the onceflow_warehouse pool")
    parser.add_argument("--workers", type=int, default=8, help="LocalExecutor parallelism")
    # At least ~60: the generator's two malformed rows a day must stay under the 5% reject ratio.
    parser.add_argument("--orders-per-day", type=int, default=80)
    args = parser.parse_args(argv)
    # `kill` (SIGTERM) unwinds like Ctrl-C, so the cluster stops and the databases are dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n_days = 30 if args.quick else args.days
    first = dt.date(2021, 1, 1)
    days = local_days(first, first + dt.timedelta(days=n_days - 1))

    shop, warehouse, reference = (postgres.create_database(t) for t in ("bshop", "bwh", "bref"))
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-backfill-"))
    try:
        config = GeneratorConfig(seed=5, timezone=TZ, orders_per_day=args.orders_per_day)
        engine = make_engine(shop)
        events = write_orders(
            engine, generate_orders(first - dt.timedelta(days=3), days[-1] + dt.timedelta(days=1), config)
        )
        engine.dispose()

        started = time.monotonic()
        day_by_day_pass(shop, reference, days, timezone=TZ)
        alone = time.monotonic() - started

        dags = work / "dags"
        dags.mkdir()
        shutil.copy(DAGS / "daily_sales.py", dags / "daily_sales.py")
        (dags / "empty_daily.py").write_text(textwrap.dedent(EMPTY_DAG))
        env = {
            "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": json.dumps(
                {"conn_type": "postgres", "extra": {"sqlalchemy_url": shop}}
            ),
            "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": json.dumps(
                {"conn_type": "postgres", "extra": {"sqlalchemy_url": warehouse}}
            ),
            "ONCEFLOW_BUSINESS_TZ": TZ,
            "ONCEFLOW_SALES_STAGING_DIR": str(work / "staging"),
            "ONCEFLOW_SALES_RETRIES": "0",
            "ONCEFLOW_SALES_START_DATE": "2099-01-01",  # only the backfill creates runs
        }
        with standalone_cluster(
            work, dags, env=env, pools={"onceflow_warehouse": args.slots}, parallelism=args.workers
        ) as cluster:
            empty = timed_backfill(cluster, "empty_daily", days, args.max_active_runs)
            sales = timed_backfill(cluster, "daily_sales", days, args.max_active_runs)
            loaded = partition_audits(warehouse, days)
            expected = partition_audits(reference, days)
            same = len(loaded) == n_days and {k: a[:3] for k, a in loaded.items()} == {
                k: a[:3] for k, a in expected.items()
            }
            # Printed now: the reprocess pass below takes as long again.
            print(f"  per-partition checksums equal to the day-by-day pass: {same}", flush=True)
            redo = 0.0
            if not args.no_reprocess:
                # The second half: backfill again, re-running completed runs too.
                redo = timed_backfill(
                    cluster, "daily_sales", days, args.max_active_runs, reprocess_behavior="completed"
                )
        reloaded = partition_audits(warehouse, days)
        unchanged = {k: a.checksum for k, a in reloaded.items()} == {k: a.checksum for k, a in loaded.items()}
        refenced = sum(1 for k, a in reloaded.items() if a.fence_token > loaded[k].fence_token)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for url in (shop, warehouse, reference):
            postgres.drop_database(url)

    n = len(days)
    print(f"backfill of {n} local days ({days[0]}..{days[-1]}, {TZ}), {events} shop events")
    print(
        f"  max-active-runs {args.max_active_runs}, pool onceflow_warehouse {args.slots} slots, "
        f"{args.workers} LocalExecutor workers, PostgreSQL metadata DB and warehouse"
    )
    print(f"{'':28}{'wall s':>10}{'s per run':>12}")
    for name, seconds in (
        ("empty_daily (3 no-op tasks)", empty),
        ("daily_sales", sales),
        ("work alone (no Airflow)", alone),
        *((("daily_sales, reprocess", redo),) if redo else ()),
    ):
        print(f"{name:28}{seconds:10.1f}{seconds / n:12.3f}")
    print(f"ratio daily_sales / empty_daily: {sales / empty:.2f}  (1.00 = all Airflow overhead)")
    print(
        f"Airflow's own per-run cost (empty_daily) is {min(empty / sales, 1.0):.0%} of a daily_sales run; "
        "the rest is task-side: imports and connections in three task processes, and the work"
    )
    print(f"ratio daily_sales / work alone: {sales / alone:.1f}")
    print(f"per-partition checksums equal to the day-by-day pass: {same} ({len(loaded)} partitions)")
    if redo:
        print(
            f"--reprocess-behavior completed: checksums unchanged: {unchanged}; "
            f"{refenced} of {len(reloaded)} partitions re-loaded under a newer fence token"
        )
        same = same and unchanged and refenced == len(reloaded)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
