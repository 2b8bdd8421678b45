"""Backfills of daily_sales against the same backfills of an empty DAG: the per-run overhead, and where it goes.

Run: ``.venv/bin/python benchmarks/bench_backfill.py [--days N] [--repeat R] [--quick]``
(PostgreSQL on 127.0.0.1:5432, or ``ONCEFLOW_TEST_DATABASE_URL``). Run it on an otherwise idle
machine: the load average is printed beside every figure because other work distorts them.

One real Airflow installation (PostgreSQL metadata DB, or SQLite with ``--backend sqlite``;
LocalExecutor, api-server, scheduler, dag-processor, triggerer) holds two DAGs with the same timetable (daily, Europe/Amsterdam), the
same three tasks in the same pool ``onceflow_warehouse`` and the same ``deadline=``:

* ``daily_sales``: extract from the shop database, clean with pandas, fenced partition overwrite
  into the PostgreSQL warehouse, leased and committed through the work ledger on PostgreSQL (as in
  production);
* ``empty_daily``: three tasks that do nothing; the last emits an Asset, as daily_sales' load does.

Each repetition backfills both DAGs over a fresh window of ``--days`` local days (the windows
follow each other, so every run is a first run) with ``airflow backfill create
--max-active-runs``, timed by the metadata DB's clock from the backfill's creation to its last
run's end. (Not to the scheduler marking the backfill complete: Airflow 3.3 checks that every 30 s,
``_mark_backfills_complete``, so a 25 s backfill read as ~30 s and a 31 s one as ~60 s; that timer,
not the tasks, made the "1.9x" of issue 27.) As every
side-by-side benchmark here (``sidebyside.py``): first one untimed warm-up backfill of each DAG
(``--warmup-days``; a fresh cluster's first backfill pays a one-time cost), then the repetitions
with the order of the two DAGs alternated; every repetition, the medians and their ratio are
printed with the load average. The same days are loaded day by day without Airflow (the
work alone). Then daily_sales' first window is backfilled again with ``--reprocess-behavior
completed`` (skip with ``--no-reprocess``). Every stored partition, read back from the table
(rows, net total, rejects, checksum of the stored rows), must equal the day-by-day pass after both
passes, and row counts and net totals must equal plain SQL over the shop.

By default the scheduler preloads pandas & co. (``onceflow.preload`` from
``airflow_local_settings.py``, the deployment setting docs/daily-sales.md recommends), so the
LocalExecutor's forked task processes start with them; ``--no-preload`` measures without.

Where the time goes: a listener plugin records, in every task process, the CPU time and wall time
from the process start (the fork) to the task's start (``startup``: process set-up, DAG file
parse, imports at parse time) and from there to its end (``execute``), printed per task as
medians for both DAGs; and the scheduler's timeline of each task instance from the metadata DB
(after the step before until scheduled, waiting for a pool slot, queued, running).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_meter
from onceflow.preload import write_local_settings
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders
from onceflow.testing import postgres
from onceflow.testing.sales_backfill import (
    create_backfill,
    day_by_day_pass,
    local_days,
    partition_audits,
    reference_totals,
    standalone_cluster,
    stored_partitions,
    wait_for_backfill,
)
from sidebyside import Result, measure_sides, print_table

TZ = "Europe/Amsterdam"
DAGS = Path(__file__).resolve().parents[1] / "dags"

EMPTY_DAG = """
import pendulum
from airflow.sdk import Asset, CronDataIntervalTimetable, dag, task

from onceflow.notifications.deadline import daily_load_deadline
from onceflow.priority import RecentFirstWeightStrategy


@dag(
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="Europe/Amsterdam"),
    start_date=pendulum.datetime(2099, 1, 1, tz="Europe/Amsterdam"),
    catchup=False,
    max_active_runs=4,
    tags=["benchmark"],
    doc_md="daily_sales' shape and settings with no work: the per-run cost of Airflow.",
    default_args={"owner": "onceflow", "retries": 0, "pool": "onceflow_warehouse",
                  "weight_rule": RecentFirstWeightStrategy()},
    deadline=daily_load_deadline(business_timezone="Europe/Amsterdam"),
)
def empty_daily():
    @task
    def extract() -> None:
        pass

    @task
    def clean() -> None:
        pass

    # daily_sales' load emits its table's Asset: the asset event is Airflow's work of that shape
    @task(outlets=[Asset(name="onceflow.bench.empty_daily", uri="x-onceflow://bench/empty_daily")])
    def load() -> None:
        pass

    extract() >> clean() >> load()


empty_daily()
"""

# A listener in every task process: CPU and wall time from the fork to the task's start and to
# its end (getrusage counts from zero in a forked child; /proc gives the process start).
TASK_COSTS_PLUGIN = """
import json, os, resource, sys

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

_started = {}


def _age():
    # /proc/self/stat's start time (clock ticks since boot) against /proc/uptime: to 10 ms, where
    # psutil's create_time() rests on a boot time in whole seconds (up to 1 s off, the same for all)
    with open("/proc/self/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as uptime:
        return float(uptime.read().split()[0]) - started


def _now():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, _age()


@hookimpl
def on_starting(component):
    # in a task process: after the supervisor's start call and StartupDetails, before the DAG parse
    _started["parse"] = _now()


@hookimpl
def on_task_instance_running(previous_state, task_instance):
    _started["at"] = _now()
    import task_waits  # beside this plugin; patched in task processes only, from the task's start

    task_waits.install()
    task_waits.reset()
    if os.environ.get("ONCEFLOW_TASK_PROFILE_DIR"):  # --profile-dir: a cProfile of each task's execute
        import cProfile

        _started["profile"] = cProfile.Profile()
        _started["profile"].enable()


@hookimpl
def on_task_instance_success(previous_state, task_instance):
    cpu, wall = _now()
    if "profile" in _started:
        _started["profile"].disable()
        _started["profile"].dump_stats(os.path.join(
            os.environ["ONCEFLOW_TASK_PROFILE_DIR"],
            f"{task_instance.dag_id}.{task_instance.task_id}.{os.getpid()}.pstats",
        ))
    cpu0, wall0 = _started.get("at", (cpu, wall))
    cpu_p, wall_p = _started.get("parse", (cpu0, wall0))
    record = {"dag_id": task_instance.dag_id, "task_id": task_instance.task_id,
              "startup_cpu": cpu0, "startup_wall": wall0,
              "before_parse_cpu": cpu_p, "before_parse_wall": wall_p,
              "execute_cpu": cpu - cpu0, "execute_wall": wall - wall0}
    import task_waits

    record["waits"] = task_waits.snapshot()
    fd = os.open(os.environ["ONCEFLOW_TASK_COSTS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(record) + "\\n").encode())
    finally:
        os.close(fd)


class TaskCostsPlugin(AirflowPlugin):
    name = "onceflow_bench_task_costs"
    listeners = [sys.modules[__name__]]
"""


def timed_backfill(
    cluster: Any,
    dag_id: str,
    days: list[dt.date],
    max_active_runs: int,
    reprocess_behavior: str | None = None,
    cpu_out: dict[str, float] | None = None,
) -> float:
    """Seconds from ``airflow backfill create`` to the scheduler completing the backfill.

    ``cpu_out``: filled with the CPU seconds each component spent from the backfill's creation
    (after the CLI's own start-up) until its last run ended (polled every 0.5 s; the scheduler
    marks the backfill complete up to half a minute later, idle time that is not the runs' cost).
    """
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
    if cpu_out is not None:
        before = cpu_meter.snapshot(cluster.component_pids())
        wait_for_runs_ended(cluster, backfill, len(days))
        cpu_out.update(cpu_meter.spent(before, cpu_meter.snapshot(cluster.component_pids())))
    runs = wait_for_backfill(cluster, backfill, timeout=12 * 3600, poll=5.0)
    polled = time.monotonic() - started
    # The compared figure comes from the metadata DB's own clock: the backfill's creation to its
    # last run's end. The poll above (every 5 s) would add up to 5 s to a 30 s backfill, and the
    # CLI's start-up (the same few seconds on both sides) would dilute the ratio.
    (span,) = cluster.query(
        "SELECT MAX(r.end_date) AS ended, b.created_at AS created FROM backfill b "
        "JOIN backfill_dag_run bd ON bd.backfill_id = b.id JOIN dag_run r ON r.id = bd.dag_run_id "
        "WHERE b.id = :id GROUP BY b.created_at",
        id=backfill,
    )
    elapsed = seconds_between(span["created"], span["ended"])
    backfills.setdefault(dag_id, []).append(backfill)
    print(
        f"  {dag_id} backfill {backfill}: {len(runs)} runs in {elapsed:.1f} s "
        f"(creation to last run's end; command to poll seeing it complete: {polled:.1f} s)",
        flush=True,
    )
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


def wait_for_runs_ended(cluster: Any, backfill: int, runs: int, timeout: float = 12 * 3600) -> None:
    """Until the backfill has an entry for each of its ``runs`` dates and none of its runs is queued
    or running. A date the backfill skipped has an entry without a run (``dag_run_id`` NULL): it
    counts as ended, and ``timed_backfill``'s run count then reports it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (row,) = cluster.query(
            "SELECT COUNT(*) AS n, SUM(CASE WHEN r.state IN ('queued', 'running') THEN 1 ELSE 0 END) AS open "
            "FROM backfill_dag_run bd LEFT JOIN dag_run r ON r.id = bd.dag_run_id WHERE bd.backfill_id = :id",
            id=backfill,
        )
        if row["n"] >= runs and not row["open"]:
            return
        time.sleep(0.5)
    raise TimeoutError(f"backfill {backfill}: runs still open after {timeout:.0f} s\n{cluster.log_tails()}")


# Backfill ids per DAG, in the order they ran (the first is the warm-up), for the timeline.
backfills: dict[str, list[int]] = {}

# Every task instance of some backfills with its run's and its own timestamps: the medians of
# timeline() and the raw lines of dump_timeline() (--timeline-file).
TIMELINE_SQL = """
SELECT bd.backfill_id, ti.dag_id, ti.run_id, ti.task_id, r.start_date AS run_start, r.end_date AS run_end,
       ti.scheduled_dttm, ti.queued_dttm, ti.start_date, ti.end_date
FROM task_instance ti
JOIN dag_run r ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id
JOIN backfill_dag_run bd ON bd.dag_run_id = r.id
WHERE bd.backfill_id IN ({ids})
ORDER BY bd.backfill_id, ti.run_id, ti.start_date
"""


def timestamp(value: Any) -> dt.datetime:
    """A metadata timestamp as read back: a datetime on PostgreSQL, ISO text through SQLite."""
    return value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))


def seconds_between(earlier: Any, later: Any) -> float:
    return (timestamp(later) - timestamp(earlier)).total_seconds()


def timeline(cluster: Any, ids: list[int]) -> dict[str, dict[str, float]]:
    """Median seconds per task: after the step before (or the run's start) until scheduled, then
    waiting for a pool slot (scheduled to queued), queued until the task started, and running."""
    per_task: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    previous: dict[str, Any] = {}  # run_id -> the end of its task that ran before
    for row in cluster.query(TIMELINE_SQL.format(ids=",".join(str(int(i)) for i in ids))):
        stamps = (row["scheduled_dttm"], row["queued_dttm"], row["start_date"], row["end_date"])
        if any(v is None for v in stamps):
            continue
        scheduled, queued, started, ended = stamps
        t = per_task[row["task_id"]]
        t["gap"].append(seconds_between(previous.get(row["run_id"], row["run_start"]), scheduled))
        t["slot_wait"].append(seconds_between(scheduled, queued))
        t["queued"].append(seconds_between(queued, started))
        t["running"].append(seconds_between(started, ended))
        previous[row["run_id"]] = ended
    return {
        task: {key: statistics.median(values) for key, values in keys.items()}
        for task, keys in per_task.items()
    }


def dump_timeline(cluster: Any, ids: list[int], path: Path) -> None:
    """Every task instance of these backfills with its run's and its own timestamps, as JSON lines."""
    rows = cluster.query(TIMELINE_SQL.format(ids=",".join(str(int(i)) for i in ids)))
    with path.open("w") as out:
        for row in rows:
            out.write(
                json.dumps({k: (str(v) if v is not None else None) for k, v in dict(row).items()}) + "\n"
            )


def task_waits(path: Path) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """Median count and seconds of each wait (``task_waits``) per (dag, task), task start to end."""
    samples: dict[tuple[str, str], list[dict[str, list[float]]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            samples[(record["dag_id"], record["task_id"])].append(record.get("waits", {}))
    return {
        key: {
            kind: (
                statistics.median(w.get(kind, [0, 0.0])[0] for w in records),
                statistics.median(w.get(kind, [0, 0.0])[1] for w in records),
            )
            for kind in sorted({k for w in records for k in w})
        }
        for key, records in sorted(samples.items())
    }


def task_costs(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """Median startup/execute CPU and wall seconds per (dag, task) from the listener's records."""
    samples: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            samples[(record["dag_id"], record["task_id"])].append(record)
    return {
        key: {
            k: statistics.median(r[k] for r in records) for k in records[0] if k.endswith(("_cpu", "_wall"))
        }
        | {"n": float(len(records))}
        for key, records in sorted(samples.items())
    }


WORKLOAD_FINISHED = re.compile(r"Workload finished .*?duration=([\d.]+).*?workload_id=([0-9a-f-]+)")
TI_FINISHED = re.compile(
    r"TaskInstance Finished: dag_id=([^,]+), task_id=([^,]+), .*?ti_id=([0-9a-f-]+), .*?run_duration=([\d.]+)"
)


def supervisor_lingers(scheduler_log: Path, offset: int) -> dict[tuple[str, str], list[float]]:
    """Per (dag, task): seconds each supervisor (a LocalExecutor worker) stayed after its task ended.

    From the scheduler's log past ``offset``: a workload's duration (fork to the supervisor's end)
    less its task's run duration (start to end in the metadata DB).
    """
    if not scheduler_log.exists():
        return {}
    with scheduler_log.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    workloads = {m.group(2): float(m.group(1)) for m in WORKLOAD_FINISHED.finditer(text)}
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for m in TI_FINISHED.finditer(text):
        dag_id, task_id, ti_id, ran = m.groups()
        if ti_id in workloads:
            out[(dag_id, task_id)].append(workloads[ti_id] - float(ran))
    return out


def print_cpu_table(samples: list[Any], dag_ids: tuple[str, ...]) -> None:
    """CPU seconds per backfilled run by component, median of the timed repetitions of each side.

    From the backfill's creation (after the ``airflow backfill create`` command) until its last run
    ended (polled every 0.5 s); ``machine`` is every core of the machine, the benchmark's own
    polling included.
    """
    timed = [s for s in samples if s.rep > 0 and "cpu" in s.detail]
    if not timed:
        return
    parts = list(dict.fromkeys(k for s in timed for k in s.detail["cpu"]))
    print("CPU seconds per backfilled run, by component (median of the timed repetitions):")
    print(f"  {'component':<16}" + "".join(f"{d:>14}" for d in dag_ids) + f"{'difference':>12}")
    for part in parts:
        values = [
            statistics.median(s.detail["cpu"].get(part, 0.0) for s in timed if s.side == d) for d in dag_ids
        ]
        print(f"  {part:<16}" + "".join(f"{v:14.3f}" for v in values) + f"{values[-1] - values[0]:12.3f}")
    machine = {d: [s.detail["cpu"]["machine"] for s in timed if s.side == d] for d in dag_ids}
    print(
        "  machine CPU per run, every repetition: "
        + "; ".join(f"{d} " + ", ".join(f"{v:.3f}" for v in machine[d]) for d in dag_ids)
    )
    base, last = (statistics.median(machine[d]) for d in (dag_ids[0], dag_ids[-1]))
    if len(dag_ids) > 1 and base > 0:
        print(f"  machine CPU per run, {dag_ids[-1]} / {dag_ids[0]}: {last / base:.2f}x")


def airflow_settings(pairs: list[str]) -> dict[str, str]:
    """``section.key=value`` pairs as ``AIRFLOW__SECTION__KEY`` environment variables."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        section, dot, key = name.partition(".")
        if not (sep and dot and section and key):
            raise SystemExit(f"--airflow-set {pair!r}: expected SECTION.KEY=VALUE")
        env[f"AIRFLOW__{section.upper()}__{key.upper()}"] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--days", type=int, default=730, help="local days per backfill (default 730)")
    parser.add_argument("--repeat", type=int, default=1, help="backfills of each DAG, fresh days each time")
    parser.add_argument("--quick", action="store_true", help="3 repetitions of 20 days, 4 warm-up days")
    parser.add_argument(
        "--warmup-days",
        type=int,
        default=None,
        help="days of the untimed warm-up backfill of each DAG (default 8)",
    )
    parser.add_argument("--max-active-runs", type=int, default=8)
    parser.add_argument(
        "--no-reprocess", action="store_true", help="skip the --reprocess-behavior completed pass"
    )
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="do not preload pandas & co. in the scheduler (onceflow.preload, airflow_local_settings.py)",
    )
    parser.add_argument(
        "--skip-empty",
        action="store_true",
        help="daily_sales only (the correctness run of a long window): no empty-DAG comparison",
    )
    parser.add_argument(
        "--backend",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="where the metadata DB, ledger and warehouse live (the shop stays on PostgreSQL)",
    )
    parser.add_argument(
        "--timeline-file",
        type=Path,
        default=None,
        help="also write every task instance's and run's timestamps of the timed repetitions (JSON lines)",
    )
    parser.add_argument(
        "--airflow-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="an Airflow setting for both sides, e.g. workers.min_heartbeat_interval=1 (repeatable)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="write a cProfile of each task process from its start to its end here",
    )
    parser.add_argument("--slots", type=int, default=4, help="slots of the onceflow_warehouse pool")
    parser.add_argument("--workers", type=int, default=8, help="LocalExecutor parallelism")
    # At least ~60: the generator's two malformed rows a day must stay under the 5% reject ratio.
    parser.add_argument("--orders-per-day", type=int, default=80)
    args = parser.parse_args(argv)
    # `kill` (SIGTERM) unwinds like Ctrl-C, so the cluster stops and the databases are dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n_days, repeat = (20, 3) if args.quick else (args.days, args.repeat)
    warmup_days = args.warmup_days if args.warmup_days is not None else (4 if args.quick else 8)
    first = dt.date(2021, 1, 1)
    all_days = local_days(first, first + dt.timedelta(days=warmup_days + n_days * repeat - 1))
    # windows[0]: the warm-up of both DAGs; windows[r]: repetition r of both
    windows = [all_days[:warmup_days]] + [
        all_days[warmup_days + i * n_days : warmup_days + (i + 1) * n_days] for i in range(repeat)
    ]

    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-backfill-"))
    on_sqlite = args.backend == "sqlite"
    # The shop (the source system) and the day-by-day reference stay on PostgreSQL: plain SQL over
    # the shop is the independent check. --backend sqlite puts what a deployment chooses there:
    # the metadata DB (write-ahead log, as `make run` sets it), the ledger and the warehouse.
    shop, reference = (postgres.create_database(t) for t in ("bshop", "bref"))
    if on_sqlite:
        warehouse, ledger = f"sqlite:///{work / 'warehouse.db'}", f"sqlite:///{work / 'ledger.db'}"
    else:
        warehouse, ledger = (postgres.create_database(t) for t in ("bwh", "bledger"))
    costs_file = work / "task_costs.jsonl"
    samples: list[Any] = []
    try:
        config = GeneratorConfig(seed=5, timezone=TZ, orders_per_day=args.orders_per_day)
        engine = make_engine(shop)
        events = write_orders(
            engine, generate_orders(first - dt.timedelta(days=3), all_days[-1] + dt.timedelta(days=1), config)
        )
        engine.dispose()

        started = time.monotonic()
        expected = day_by_day_pass(shop, reference, all_days, timezone=TZ)
        alone = (time.monotonic() - started) / len(all_days)
        by_sql = reference_totals(shop, all_days, timezone=TZ)
        sql_agrees = {k: (p.row_count, p.net_cents) for k, p in expected.items()} == {
            k: (t.row_count, t.net_cents) for k, t in by_sql.items()
        }

        dags, plugins = work / "dags", work / "plugins"
        dags.mkdir()
        plugins.mkdir()
        shutil.copy(DAGS / "daily_sales.py", dags / "daily_sales.py")
        (dags / "empty_daily.py").write_text(textwrap.dedent(EMPTY_DAG))
        (plugins / "onceflow_bench_task_costs.py").write_text(textwrap.dedent(TASK_COSTS_PLUGIN))
        shutil.copy(Path(__file__).with_name("task_waits.py"), plugins / "task_waits.py")
        if not args.no_preload:
            # The deployment setting docs/daily-sales.md recommends for forking executors.
            write_local_settings(work / "home")

        def conn(url: str) -> str:
            if url.startswith("sqlite:///"):  # as `make run` gives its SQLite files
                return json.dumps({"conn_type": "sqlite", "host": url.removeprefix("sqlite:///")})
            return json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}})

        env = {
            "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": conn(shop),
            "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": conn(warehouse),
            "AIRFLOW_CONN_ONCEFLOW_LEDGER": conn(ledger),  # production keeps the ledger on PostgreSQL
            "ONCEFLOW_BUSINESS_TZ": TZ,
            "ONCEFLOW_SALES_STAGING_DIR": str(work / "staging"),
            "ONCEFLOW_SALES_RETRIES": "0",
            "ONCEFLOW_SALES_START_DATE": "2099-01-01",  # only the backfill creates runs
            "ONCEFLOW_TASK_COSTS_FILE": str(costs_file),
        }
        env.update(airflow_settings(args.airflow_set))
        if args.profile_dir:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            env["ONCEFLOW_TASK_PROFILE_DIR"] = str(args.profile_dir.resolve())
        with standalone_cluster(
            work,
            dags,
            env=env,
            pools={"onceflow_warehouse": args.slots},
            parallelism=args.workers,
            use_postgres=not on_sqlite,
        ) as cluster:
            dag_ids = ("daily_sales",) if args.skip_empty else ("empty_daily", "daily_sales")

            warm: dict[str, Any] = {"done": False, "log_offset": 0}
            scheduler_log = cluster.workdir / "scheduler.log"

            def side(dag_id: str) -> Any:
                def run(rep: int) -> Result:
                    if rep > 0 and not warm["done"]:  # the task costs below leave the warm-up out
                        costs_file.unlink(missing_ok=True)
                        warm["done"] = True
                        warm["log_offset"] = scheduler_log.stat().st_size
                    window = windows[rep]
                    cpu: dict[str, float] = {}
                    seconds = timed_backfill(cluster, dag_id, window, args.max_active_runs, cpu_out=cpu)
                    return Result(
                        seconds / len(window),
                        {
                            "wall": seconds,
                            "runs": len(window),
                            "cpu": {k: v / len(window) for k, v in cpu.items()},
                        },
                    )

                return run

            samples = measure_sides({d: side(d) for d in dag_ids}, repeat)
            lines = {d: timeline(cluster, backfills[d][1:]) for d in dag_ids}  # the warm-up left out
            lingers = supervisor_lingers(scheduler_log, warm["log_offset"])
            if args.timeline_file:
                dump_timeline(cluster, [i for d in dag_ids for i in backfills[d][1:]], args.timeline_file)
            loaded = stored_partitions(warehouse, all_days)
            same = loaded == expected
            # Printed now: the reprocess pass below takes as long again.
            print(f"  stored partitions equal to the day-by-day pass: {same}", flush=True)
            redo = 0.0
            tokens_before = partition_audits(warehouse, windows[1])
            if not args.no_reprocess:
                # The second half: backfill again, re-running completed runs too.
                redo = timed_backfill(
                    cluster, "daily_sales", windows[1], args.max_active_runs, reprocess_behavior="completed"
                )
        reloaded = stored_partitions(warehouse, all_days)
        unchanged = reloaded == expected
        tokens_after = partition_audits(warehouse, windows[1])
        refenced = sum(1 for k, a in tokens_after.items() if a.fence_token > tokens_before[k].fence_token)
        costs = task_costs(costs_file)
        waits = task_waits(costs_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for url in (shop, warehouse, reference, ledger):
            if url.startswith("postgresql"):
                postgres.drop_database(url)

    print(
        f"backfills of {n_days} local days x {repeat} after a {warmup_days}-day warm-up of each DAG "
        f"({all_days[0]}..{all_days[-1]}, {TZ}), {events} shop events"
    )
    print(
        f"  max-active-runs {args.max_active_runs}, pool onceflow_warehouse {args.slots} slots, "
        f"{args.workers} LocalExecutor workers, {os.cpu_count()} CPUs; "
        + (
            "SQLite metadata DB (write-ahead log), ledger and warehouse, PostgreSQL shop; "
            if on_sqlite
            else "PostgreSQL metadata DB, shop, warehouse and ledger; "
        )
        + f"task libraries preloaded in the scheduler: {not args.no_preload}"
    )
    for s in samples:
        print(f"  {s.side} rep {s.rep or 'warm-up'}: {s.detail['runs']} runs in {s.detail['wall']:.1f} s")
    med = print_table(samples, baseline=dag_ids[0], unit="s per backfilled run")
    print_cpu_table(samples, dag_ids)
    sales = med["daily_sales"]
    print(f"daily_sales / work alone ({alone:.3f} s a day without Airflow): {sales / alone:.1f}x")
    if redo:
        print(f"daily_sales --reprocess-behavior completed over {len(windows[1])} days: {redo:.1f} s")
    print(
        "where the time goes, per task process of the timed repetitions (median seconds; startup = fork to task start):"
    )
    print(
        "  (of the startup wall: fork to the DAG parse, i.e. the supervisor's start call and the task's"
        " StartupDetails, then the parse, template rendering and pre-execute API calls)"
    )
    print(
        f"  {'dag.task':<22}{'n':>5}{'startup cpu':>13}{'startup wall':>14}{'to parse':>10}{'parse..start':>14}"
        f"{'execute cpu':>13}{'execute wall':>14}"
    )
    for (dag_id, task_id), c in costs.items():
        to_parse = c["before_parse_wall"]
        print(
            f"  {dag_id + '.' + task_id:<22}{int(c['n']):>5}{c['startup_cpu']:13.2f}{c['startup_wall']:14.2f}"
            f"{to_parse:10.2f}{c['startup_wall'] - to_parse:14.2f}"
            f"{c['execute_cpu']:13.2f}{c['execute_wall']:14.2f}"
        )
    print(
        "the scheduler's timeline per task instance of the timed repetitions, from the metadata DB "
        "(median seconds): after the step before until scheduled, scheduled to queued (a pool slot), "
        "queued to started, started to ended"
    )
    print(f"  {'dag.task':<22}{'gap':>8}{'slot wait':>11}{'queued':>9}{'running':>9}")
    for dag_id, tasks in lines.items():
        for task_id, t in sorted(tasks.items()):
            print(
                f"  {dag_id + '.' + task_id:<22}{t.get('gap', 0):8.2f}{t.get('slot_wait', 0):11.2f}"
                f"{t.get('queued', 0):9.2f}{t.get('running', 0):9.2f}"
            )
    print("waits from each task's start to its end, per task process (median count, median ms):")
    for (dag_id, task_id), kinds in waits.items():
        print(f"  {dag_id}.{task_id}")
        for kind, (count, seconds) in kinds.items():
            print(f"    {kind:<34}{count:>6g}{seconds * 1000:>10.1f} ms")
    print(
        "supervisors that saw their task process exit late (Airflow's supervisor: when the task's sockets"
        " close before the exit is visible, it waits up to [workers] min_heartbeat_interval, 5 s by default,"
        " holding a LocalExecutor worker), timed repetitions:"
    )
    for (dag_id, task_id), extras in sorted(lingers.items()):
        late = [x for x in extras if x > 1.0]
        print(
            f"  {dag_id + '.' + task_id:<22} {len(late):>3} of {len(extras):>3} more than 1 s after the task's end"
            + (f" (median {statistics.median(late):.1f} s)" if late else "")
        )
    print(f"row counts and net totals of the day-by-day pass equal plain SQL over the shop: {sql_agrees}")
    print(f"stored partitions (read back) equal to the day-by-day pass: {same} ({len(loaded)} partitions)")
    ok = same and sql_agrees
    if redo:
        print(
            f"after --reprocess-behavior completed: stored partitions equal: {unchanged}; "
            f"{refenced} of {len(tokens_after)} partitions re-loaded under a newer fence token"
        )
        ok = ok and unchanged and refenced == len(tokens_after)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
