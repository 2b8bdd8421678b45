"""The same daily_sales backfill on LocalExecutor and on Celery (two HA schedulers, two workers).

Run: ``.venv/bin/python benchmarks/bench_celery_backfill.py [--days 30] [--repeat 3]``
(PostgreSQL on 127.0.0.1:5432 or ``ONCEFLOW_TEST_DATABASE_URL``; Redis on 127.0.0.1:6379). Run it
on an otherwise idle machine: the load average is printed beside every figure.

Real Airflow installations, one at a time, each with a fresh PostgreSQL metadata DB:

* ``local``: api-server, one scheduler with the LocalExecutor (``--slots`` task slots), dag-processor,
  triggerer (``onceflow.testing.airflow_cluster``);
* ``celery``: api-server, two schedulers, two Celery workers on Redis with ``--slots`` / 2 slots
  each and private homes, dag-processor, triggerer (``onceflow.testing.celery_cluster``).

Both run ``daily_sales`` with the same pool (``onceflow_warehouse``), shop, warehouse and ledger
databases. Each measurement starts its own installation, backfills ``--warmup-days`` untimed (a
fresh cluster's first backfill pays a one-time cost), then a fresh window of ``--days`` local days
(every run a first run), timed from ``airflow backfill create`` to the scheduler completing it
(``timed_backfill`` of ``bench_backfill.py``). The executors alternate across repetitions
(``sidebyside.py``: local, celery; celery, local; ...); every repetition with its load average,
the medians per run and their ratio are printed. Every stored partition,
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
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_backfill import TZ, timed_backfill
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.testing import postgres
from onceflow.testing.sales_backfill import day_by_day_pass, local_days, standalone_cluster, stored_partitions
from sidebyside import Result, measure_sides, print_table

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
    parser.add_argument("--warmup-days", type=int, default=4, help="untimed backfill on each fresh cluster")
    parser.add_argument("--quick", action="store_true", help="1 repetition of 6 days, 2 warm-up days")
    args = parser.parse_args(argv)
    if args.quick:
        args.days, args.repeat, args.warmup_days = 6, 1, 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    first = dt.date(2021, 1, 1)
    span = args.warmup_days + args.days  # one measurement: its warm-up window, then its timed one
    measurements = args.repeat * len(EXECUTORS)
    all_days = local_days(first, first + dt.timedelta(days=span * measurements - 1))
    slots = [all_days[i * span : (i + 1) * span] for i in range(measurements)]

    shop, warehouse, reference, ledger = (
        postgres.create_database(t) for t in ("cbshop", "cbwh", "cbref", "cbledger")
    )
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-celery-"))
    samples: list[Any] = []
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
        used = iter(slots)

        def side(executor: str) -> Any:
            def run(rep: int) -> Result:
                days = next(used)
                with standalone_cluster(
                    work / f"{executor}-{rep}",
                    dags,
                    env=env,
                    pools={"onceflow_warehouse": args.pool},
                    parallelism=args.slots,
                    executor=executor,
                    celery={"workers": 2, "worker_concurrency": max(1, args.slots // 2)},
                ) as cluster:
                    warm = days[: args.warmup_days]
                    timed_backfill(cluster, "daily_sales", warm, args.max_active_runs)  # untimed
                    window = days[args.warmup_days :]
                    seconds = timed_backfill(cluster, "daily_sales", window, args.max_active_runs)
                return Result(seconds / len(window), {"wall": seconds})

            return run

        # each measurement warms its own fresh cluster up, so no separate warm-up pass
        samples = measure_sides({e: side(e) for e in EXECUTORS}, args.repeat, warmup=False)
        loaded = stored_partitions(warehouse, all_days)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for url in (shop, warehouse, reference, ledger):
            postgres.drop_database(url)

    print(
        f"daily_sales backfills of {args.days} local days x {args.repeat} per executor, each after "
        f"{args.warmup_days} untimed days on the same fresh cluster, max-active-runs "
        f"{args.max_active_runs}, pool onceflow_warehouse {args.pool} slots, {args.slots} task slots "
        f"(LocalExecutor parallelism, or 2 Celery workers x {max(1, args.slots // 2)}), {os.cpu_count()} CPUs"
    )
    for s in samples:
        print(f"  {s.side} rep {s.rep}: {s.detail['wall']:.1f} s")
    print_table(samples, baseline="local", unit="s per backfilled run")
    same = loaded == expected
    print(f"stored partitions (read back) equal to the day-by-day pass: {same} ({len(loaded)} partitions)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
