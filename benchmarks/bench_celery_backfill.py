"""The same daily_sales backfill on LocalExecutor and on Celery (two HA schedulers, two workers).

Run: ``.venv/bin/python benchmarks/bench_celery_backfill.py [--days 30] [--repeat 3]``
(PostgreSQL on 127.0.0.1:5432 or ``ONCEFLOW_TEST_DATABASE_URL``; Redis on 127.0.0.1:6379). Run it
on an otherwise idle machine: the load average is printed beside every figure.

Two real Airflow installations, one after the other, each with a fresh PostgreSQL metadata DB:

* ``local``: api-server, one scheduler with the LocalExecutor (``--slots`` task slots), dag-processor,
  triggerer (``onceflow.testing.airflow_cluster``);
* ``celery``: api-server, two schedulers, two Celery workers on Redis with ``--slots`` / 2 slots
  each and private homes, dag-processor, triggerer (``onceflow.testing.celery_cluster``).

Both run ``daily_sales`` with the same pool (``onceflow_warehouse``), shop, warehouse and ledger
databases. Each repetition backfills a fresh window of ``--days`` local days (every run a first
run), timed from ``airflow backfill create`` to the scheduler completing it (``timed_backfill``
of ``bench_backfill.py``); the medians per run and their ratio are printed. Every stored partition,
read back from the table, must equal the day-by-day pass. Staging goes through ``onceflow_storage``
(as in production, where it is a bucket the workers share instead of a disk), here a ``file://``
folder standing for the bucket.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_backfill import TZ, load_average, timed_backfill
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.testing import postgres
from onceflow.testing.sales_backfill import day_by_day_pass, local_days, standalone_cluster, stored_partitions

DAGS = Path(__file__).resolve().parents[1] / "dags"
EXECUTORS = ("local", "celery")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--days", type=int, default=30, help="local days per backfill (default 30)")
    parser.add_argument("--repeat", type=int, default=3, help="backfills per executor, fresh days each time")
    parser.add_argument("--max-active-runs", type=int, default=8)
    parser.add_argument(
        "--slots", type=int, default=8, help="task slots: LocalExecutor parallelism, or 2 workers x slots/2"
    )
    parser.add_argument("--pool", type=int, default=4, help="slots of the onceflow_warehouse pool")
    parser.add_argument("--orders-per-day", type=int, default=80)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    first = dt.date(2021, 1, 1)
    windows_needed = args.repeat * len(EXECUTORS)
    all_days = local_days(first, first + dt.timedelta(days=args.days * windows_needed - 1))
    windows = [all_days[i * args.days : (i + 1) * args.days] for i in range(windows_needed)]

    shop, warehouse, reference, ledger = (
        postgres.create_database(t) for t in ("cbshop", "cbwh", "cbref", "cbledger")
    )
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-celery-"))
    rows: list[tuple[str, int, float, float, str]] = []  # (executor, repetition, wall s, s per run, load)
    try:
        config = GeneratorConfig(seed=5, timezone=TZ, orders_per_day=args.orders_per_day)
        engine = make_engine(shop)
        write_orders(
            engine, generate_orders(first - dt.timedelta(days=3), all_days[-1] + dt.timedelta(days=1), config)
        )
        engine.dispose()
        expected = day_by_day_pass(shop, reference, all_days, timezone=TZ)

        dags = work / "dags"
        dags.mkdir()
        shutil.copy(DAGS / "daily_sales.py", dags / "daily_sales.py")

        def conn(url: str) -> str:
            return json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}})

        env = {
            "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": conn(shop),
            "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": conn(warehouse),
            "AIRFLOW_CONN_ONCEFLOW_LEDGER": conn(ledger),
            "ONCEFLOW_BUSINESS_TZ": TZ,
            "AIRFLOW_CONN_ONCEFLOW_STORAGE": json.dumps(
                {"conn_type": "generic", "extra": {"base": (work / "storage").as_uri()}}
            ),
            "ONCEFLOW_SALES_RETRIES": "0",
            "ONCEFLOW_SALES_START_DATE": "2099-01-01",
        }
        for n, executor in enumerate(EXECUTORS):
            print(f"{executor}:", flush=True)
            with standalone_cluster(
                work / executor,
                dags,
                env=env,
                pools={"onceflow_warehouse": args.pool},
                parallelism=args.slots,
                executor=executor,
                celery={"workers": 2, "worker_concurrency": max(1, args.slots // 2)},
            ) as cluster:
                for rep in range(args.repeat):
                    window = windows[n * args.repeat + rep]
                    load = load_average()
                    seconds = timed_backfill(cluster, "daily_sales", window, args.max_active_runs)
                    rows.append((executor, rep + 1, seconds, seconds / len(window), load))
        loaded = stored_partitions(warehouse, all_days)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for url in (shop, warehouse, reference, ledger):
            postgres.drop_database(url)

    print(
        f"daily_sales backfills of {args.days} local days x {args.repeat} per executor, max-active-runs "
        f"{args.max_active_runs}, pool onceflow_warehouse {args.pool} slots, {args.slots} task slots "
        f"(LocalExecutor parallelism, or 2 Celery workers x {max(1, args.slots // 2)}), {os.cpu_count()} CPUs"
    )
    print(f"{'executor':<9}{'rep':>4}{'wall s':>9}{'s per run':>11}  load average 1/5/15 at start")
    for executor, rep, seconds, per_run, load in rows:
        print(f"{executor:<9}{rep:>4}{seconds:9.1f}{per_run:11.3f}  {load}")
    median = {e: statistics.median(r[3] for r in rows if r[0] == e) for e in EXECUTORS}
    print(
        f"median s per run: local {median['local']:.3f}, celery {median['celery']:.3f}; "
        f"celery / local: {median['celery'] / median['local']:.2f}x (load average now {load_average()})"
    )
    same = loaded == expected
    print(f"stored partitions (read back) equal to the day-by-day pass: {same} ({len(loaded)} partitions)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
