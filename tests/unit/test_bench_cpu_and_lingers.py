"""The backfill benchmark's new figures: CPU per process tree, late supervisors, --airflow-set.

``cpu_meter.tree_cpu`` is checked against a real child process that burns CPU, alive and after it
was reaped (counted once either way); the supervisor-lingers parser against log lines in Airflow
3.3.2's own format (copied from a benchmark's scheduler log).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cpu_meter
from bench_backfill import airflow_settings, supervisor_lingers

BURN = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint('burnt', flush=True)\nsys.stdin.read()\n"


def test_a_child_is_counted_while_alive_and_once_after_it_is_reaped() -> None:
    before = cpu_meter.tree_cpu(os.getpid())
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
    alive = cpu_meter.tree_cpu(os.getpid()) - before
    child.communicate("")  # exits and is reaped: its time moves into our children's times
    reaped = cpu_meter.tree_cpu(os.getpid()) - before
    assert alive >= 0.35, alive
    assert reaped >= 0.35, reaped
    assert reaped < alive + 0.2, (alive, reaped)  # not counted twice once reaped


def test_a_gone_root_counts_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert cpu_meter.tree_cpu(child.pid) == 0.0


def test_the_machine_counter_moves_with_work() -> None:
    before = cpu_meter.machine_busy()
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert cpu_meter.machine_busy() - before >= 0.15
    assert cpu_meter.spent({"machine": 1.0, "gone": 1.0}, {"machine": 3.5, "new": 2.0}) == {"machine": 2.5}


# Two workloads of Airflow 3.3.2's scheduler log, as the benchmark's cluster writes them.
FINISHED = (
    "2026-12-06T10:45:25.519171Z [info     ] Workload finished              [supervisor] "
    "duration={duration} exit_code=0 final_state=success loc=supervisor.py:2658 "
    "workload_id={ti} workload_type=ExecuteTask\n"
    "2026-12-06T10:45:25.545471Z [info     ] TaskInstance Finished: dag_id={dag}, task_id={task}, "
    "run_id=backfill__2021-01-02T23:00:00+00:00, map_index=-1, ti_id={ti}, "
    "run_start_date=2026-12-06 10:45:17.767309+00:00, run_end_date=2026-12-06 10:45:20.483988+00:00, "
    "run_duration={ran}, state=success, executor=LocalExecutor(parallelism=8), executor_state=success, "
    "try_number=1, max_tries=0, pool=onceflow_warehouse, queue=default, priority_weight=18415103, "
    "operator=_PythonDecoratedOperator, queued_dttm=2026-12-06 10:45:17.528952+00:00, "
    "scheduled_dttm=2026-12-06 10:45:17.517603+00:00,queued_by_job_id=1, pid=11741 "
    "[airflow.jobs.scheduler_job_runner.SchedulerJobRunner] loc=scheduler_job_runner.py:1439\n"
)


def test_late_supervisors_are_read_from_the_log_after_the_warm_up(tmp_path: Path) -> None:
    warm = FINISHED.format(
        duration="9.9", ti="01a24af5-0000-7000-8000-000000000001", dag="empty_daily", task="load", ran="0.1"
    )
    log = tmp_path / "scheduler.log"
    log.write_text(
        warm
        + FINISHED.format(
            duration="7.792154500000038",
            ti="01a24af5-4409-724e-86f0-25479ad1b486",
            dag="empty_daily",
            task="extract",
            ran="2.716679",
        )
        + FINISHED.format(
            duration="0.3125",
            ti="01a24af5-af69-7f9c-b3df-fea458378c87",
            dag="daily_sales",
            task="extract",
            ran="0.262205",
        )
        + "2026-12-06T10:45:26Z [info     ] unrelated line duration=1\n"
    )
    lingers = supervisor_lingers(log, offset=len(warm.encode()))
    assert set(lingers) == {("empty_daily", "extract"), ("daily_sales", "extract")}
    assert lingers[("empty_daily", "extract")] == [pytest.approx(5.0754755)]
    assert lingers[("daily_sales", "extract")] == [pytest.approx(0.050295)]
    assert supervisor_lingers(tmp_path / "missing.log", 0) == {}


def test_airflow_settings_become_environment_variables_and_bad_ones_are_refused() -> None:
    assert airflow_settings(
        ["workers.min_heartbeat_interval=1", "scheduler.scheduler_idle_sleep_time=0.1"]
    ) == {
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.1",
    }
    for bad in ("min_heartbeat_interval=1", "workers.min_heartbeat_interval", ".x=1"):
        with pytest.raises(SystemExit, match=r"expected SECTION\.KEY=VALUE"):
            airflow_settings([bad])
