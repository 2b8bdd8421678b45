"""Where a daily_sales task waits: Execution API messages, SQL, commits and fsyncs, per task.

Run: ``.venv/bin/python benchmarks/bench_task_waits.py [--days 5] [--backend postgres|sqlite]``
(PostgreSQL on 127.0.0.1:5432, or ``ONCEFLOW_TEST_DATABASE_URL``). Runs this file under pytest
(the onceflow pytest plugin sets up Airflow's metadata DB and the connections), where one
``daily_sales`` run per day goes through ``dag.test()`` with ``task_waits`` installed, then prints,
per task, the median over the days of each kind of wait: its count and its milliseconds, and the
task's wall time in ``task_runner.run``.

``dag.test()`` answers Execution API messages in this process (no HTTP): a message's time here is
the API server's work (its SQL is shown apart, ``api-side sql``), without the network and
serialisation a real supervisor adds; ``bench_backfill.py`` prints the same waits from real task
processes of a real cluster. The counts do not depend on load; the milliseconds do, so the load
average is printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RESULT_ENV = "ONCEFLOW_TASK_WAITS_OUT"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    wanted = os.environ.get("ONCEFLOW_TASK_WAITS_BACKEND", "postgres")
    if request.param != wanted:
        pytest.skip(f"--backend {wanted}")
    return str(request.param)


def test_task_waits(
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    onceflow_run_dag: Any,
    onceflow_shop_orders: Any,
    onceflow_sales_connections: Any,
    request: pytest.FixtureRequest,
) -> None:
    import pendulum

    sys.path.insert(0, str(HERE))
    import task_waits
    from onceflow.testing.dag_runner import load_dag

    if backend == "sqlite":
        warehouse, ledger = f"sqlite:///{tmp_path / 'wh.db'}", f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        factory = request.getfixturevalue("onceflow_postgres_url_factory")
        warehouse, ledger = factory("waitswh"), factory("waitsledger")
    shop = f"sqlite:///{tmp_path / 'shop.db'}"
    monkeypatch.setenv("ONCEFLOW_SALES_RETRIES", "0")
    onceflow_sales_connections(shop, warehouse)
    kind = "sqlite" if ledger.startswith("sqlite") else "postgres"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": kind, "extra": {"sqlalchemy_url": ledger}})
    )
    n = int(os.environ.get("ONCEFLOW_TASK_WAITS_DAYS", "5"))
    days = [dt.date(2024, 6, 10) + dt.timedelta(days=i) for i in range(n)]
    onceflow_shop_orders(shop, days[0] - dt.timedelta(days=1), days[-1] + dt.timedelta(days=1), seed=21)
    task_waits.install_by_task()
    for day in days:
        dag = load_dag("daily_sales")
        dag.deadline = None  # as tests/integration/test_sales_dag.py::run_day: dag.test() cannot encode it
        nxt = day + dt.timedelta(days=1)
        result = onceflow_run_dag(
            dag, logical_date=pendulum.datetime(nxt.year, nxt.month, nxt.day, tz="Europe/Amsterdam")
        )
        assert result.state == "success", result.ti_states
    Path(os.environ[RESULT_ENV]).write_text(json.dumps(task_waits.by_task_runs()))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--days", type=int, default=5, help="runs, one per day (default 5)")
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--quick", action="store_true", help="2 days")
    parser.add_argument("--statements", action="store_true", help="also each task-side SQL statement's count")
    parser.add_argument("--profile", metavar="DIR", help="also a cProfile of each task run, in DIR")
    args = parser.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"onceflow-task-waits-{os.getpid()}.json"
    env = {
        **os.environ,
        RESULT_ENV: str(out),
        "ONCEFLOW_TASK_WAITS_DAYS": str(2 if args.quick else args.days),
        "ONCEFLOW_TASK_WAITS_BACKEND": args.backend,
        **({"ONCEFLOW_TASK_WAITS_STATEMENTS": "1"} if args.statements else {}),
        **({"ONCEFLOW_TASK_WAITS_PROFILE": str(Path(args.profile).resolve())} if args.profile else {}),
    }
    load_before = os.getloadavg()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(Path(__file__)), "-q", "-p", "no:cacheprovider", "-x"], env=env
    )
    load_after = os.getloadavg()
    if done.returncode != 0 or not out.exists():
        return done.returncode or 1
    runs = json.loads(out.read_text())
    out.unlink()
    by_task: dict[str, list[tuple[float, dict[str, list[float]]]]] = defaultdict(list)
    for task_id, wall, waits in runs:
        by_task[task_id].append((wall, waits))
    print(
        f"daily_sales under dag.test(), {args.backend}, {len(runs) // max(len(by_task), 1)} runs; median per "
        f"task of each wait's count and ms; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    for task_id, samples in by_task.items():
        kinds = sorted({k for _, w in samples for k in w})
        print(f"{task_id}: wall in task_runner.run {statistics.median(s[0] for s in samples) * 1000:.0f} ms")
        for k in kinds:
            count = statistics.median(w.get(k, [0, 0.0])[0] for _, w in samples)
            ms = statistics.median(w.get(k, [0, 0.0])[1] for _, w in samples) * 1000
            print(f"  {k:<34}{count:>6g}{ms:>10.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
