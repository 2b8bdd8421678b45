"""The cost of ordering: ``depends_on_past`` on a 60-interval run with 4 workers, against without.

Run: ``.venv/bin/python benchmarks/bench_depends_on_past.py [--intervals N] [--workers N]
[--task-seconds S] [--quick]`` (PostgreSQL on 127.0.0.1:5432, or ``ONCEFLOW_TEST_DATABASE_URL``).

Two DAGs with the same daily timetable and one task that works for ``--task-seconds``
(``time.sleep``, standing in for a load), one with ``depends_on_past=True``. Each is backfilled
over the same ``--intervals`` days through the real scheduler (LocalExecutor with ``--workers``
slots, backfill ``--max-active-runs`` equal to the intervals so only ordering limits
concurrency). ``depends_on_past`` makes day D wait for day D-1's task to succeed, so the work runs
one interval at a time however many workers there are. Side by side (``sidebyside.py``): one
untimed warm-up backfill of each DAG, then ``--repeat`` backfills of each over fresh days with the
order alternated. Printed: every repetition with the load average, the medians, their ratio, and
the ideal ratio (``workers``) that pure ordering would give with zero scheduling overhead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onceflow.testing.sales_backfill import create_backfill, local_days, standalone_cluster, wait_for_backfill
from sidebyside import Result, measure_sides, print_table

DAG = """
import time

import pendulum
from airflow.sdk import CronDataIntervalTimetable, dag, task


@dag(
    dag_id="{dag_id}",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2099, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs={intervals},
    tags=["benchmark"],
    doc_md="One unit of work per interval; depends_on_past={depends_on_past}.",
    default_args={{"owner": "onceflow", "retries": 0, "depends_on_past": {depends_on_past}}},
)
def probe():
    @task
    def work() -> None:
        time.sleep({seconds})

    work()


probe()
"""


def timed(cluster: Any, dag_id: str, days: list[dt.date], intervals: int) -> tuple[float, float]:
    """Wall seconds of the backfill, and the span from the first task start to the last task end."""
    cluster.wait_for_dag(dag_id)
    started = time.monotonic()
    # Reprocess behaviour is required for depends_on_past DAGs; use the same for both.
    backfill = create_backfill(
        cluster,
        dag_id,
        days[0],
        days[-1],
        timezone="UTC",
        max_active_runs=intervals,
        reprocess_behavior="failed",
    )
    runs = wait_for_backfill(cluster, backfill, timeout=4 * 3600, poll=1.0)
    elapsed = time.monotonic() - started
    if len(runs) != len(days) or any(r["state"] != "success" for r in runs):
        raise SystemExit(
            f"{dag_id}: not every run succeeded: {[(r['run_id'], r['state']) for r in runs][:5]}"
        )
    ids = {r["run_id"] for r in runs}
    tis = [t for t in cluster.query(
        "SELECT run_id, start_date, end_date FROM task_instance WHERE dag_id = :d", d=dag_id
    ) if t["run_id"] in ids]  # fmt: skip
    first, last = min(t["start_date"] for t in tis), max(t["end_date"] for t in tis)
    return elapsed, (last - first).total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=60)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--task-seconds", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3, help="timed backfills of each DAG (default 3)")
    parser.add_argument("--quick", action="store_true", help="12 intervals, 1 timed repetition")
    args = parser.parse_args(argv)
    intervals, repeat = (12, 1) if args.quick else (args.intervals, args.repeat)
    # window 0: the warm-up of both DAGs; window r: repetition r of both
    first = dt.date(2021, 1, 1)
    all_days = local_days(first, first + dt.timedelta(days=intervals * (repeat + 1) - 1))
    windows = [all_days[i * intervals : (i + 1) * intervals] for i in range(repeat + 1)]

    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-dop-"))
    try:
        dags = work / "dags"
        dags.mkdir()
        for dag_id, dop in (("ordering_off", False), ("ordering_on", True)):
            source = DAG.format(
                dag_id=dag_id, intervals=intervals, depends_on_past=dop, seconds=args.task_seconds
            )
            (dags / f"{dag_id}.py").write_text(textwrap.dedent(source))
        with standalone_cluster(work, dags, parallelism=args.workers) as cluster:

            def side(dag_id: str) -> Any:
                def run(rep: int) -> Result:
                    wall, span = timed(cluster, dag_id, windows[rep], intervals)
                    return Result(wall, {"span": span})

                return run

            samples = measure_sides({d: side(d) for d in ("ordering_off", "ordering_on")}, repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    work_total = intervals * args.task_seconds
    print(f"{intervals} intervals x {args.task_seconds:g} s of work, {args.workers} LocalExecutor workers")
    for s in samples:
        print(
            f"  {s.side} rep {s.rep or 'warm-up'}: wall {s.value:.1f} s, task span {s.detail['span']:.1f} s"
        )
    wall = print_table(samples, baseline="ordering_off", unit="wall s of the backfill", fmt="{:.1f}")
    timed_samples = [s for s in samples if s.rep > 0]
    span = {
        d: statistics.median(s.detail["span"] for s in timed_samples if s.side == d)
        for d in ("ordering_off", "ordering_on")
    }
    on = (wall["ordering_on"], span["ordering_on"])
    print(f"cost of ordering (wall, True / False, medians): {on[0] / wall['ordering_off']:.2f}x")
    print(f"cost of ordering (task span, medians):          {on[1] / span['ordering_off']:.2f}x")
    parallel = work_total / args.workers
    print(f"ideal with zero overhead: {args.workers:.2f}x ({work_total:.0f} s serial vs {parallel:.0f} s)")
    print(f"overhead per interval with ordering: {(on[1] - work_total) / intervals:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
