"""heartbeat: prove the scheduler is making progress, to a store outside Airflow's metadata DB."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, task

from onceflow.priority import AHEAD_OF_RECENT_FIRST

DOC_MD = """
### heartbeat

One short task per run (pool `onceflow_heartbeat`, the highest priority weight) that records a
beat in the ledger database (connection `onceflow_ledger`): run id, when the run was due
(`run_after`), when the task actually started, and the lag between them. `onceflow-watchdog`,
which runs outside Airflow, alerts when beats stop or lag; a hung scheduler cannot report itself.

* Schedule: every minute (`* * * * *`); set `ONCEFLOW_HEARTBEAT_SCHEDULE` in the DAG processor's
  and scheduler's environment to a cron expression or to seconds (`10s`) to change it.
* External monitor: set `ONCEFLOW_HEARTBEAT_PING_URL` (a healthchecks.io check URL) in the
  workers' environment to also ping `/start`, success and `/fail` with the run id.

Docs: `docs/watchdog.md`.
"""


def _schedule() -> str | timedelta:
    """A cron expression, or ``<n>s`` for a fixed interval (tests use a few seconds)."""
    value = os.environ.get("ONCEFLOW_HEARTBEAT_SCHEDULE", "* * * * *").strip()
    match = re.fullmatch(r"(\d+)\s*s", value)
    return timedelta(seconds=int(match.group(1))) if match else value


@dag(
    dag_id="heartbeat",
    schedule=_schedule(),
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    # A run that could not start in time is not worth queueing behind: the next beat replaces it.
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=5),
    tags=["onceflow", "watchdog"],
    doc_md=DOC_MD,
    default_args={"owner": "onceflow", "retries": 1, "retry_delay": timedelta(seconds=5)},
)
def heartbeat() -> None:
    @task(
        task_id="beat",
        pool="onceflow_heartbeat",
        priority_weight=AHEAD_OF_RECENT_FIRST,
        weight_rule="absolute",
        execution_timeout=timedelta(seconds=60),
    )
    def beat(**context: object) -> dict[str, object]:
        """Record this run's beat; ping the external monitor around it when configured."""
        import time

        from onceflow.hooks.heartbeat import HeartbeatHook

        dag_run: Any = context["dag_run"]
        ti: Any = context["ti"]
        run_id = str(dag_run.run_id)
        due = getattr(dag_run, "run_after", None) or dag_run.logical_date
        started = getattr(ti, "start_date", None)
        hook = HeartbeatHook(ping_url=os.environ.get("ONCEFLOW_HEARTBEAT_PING_URL") or None)
        hook.ping(run_id, "start")
        try:
            beat = hook.record_beat(
                dag_id=str(dag_run.dag_id),
                run_id=run_id,
                scheduled_at=due.timestamp(),
                started_at=started.timestamp() if started is not None else time.time(),
                try_number=int(getattr(ti, "try_number", 1) or 1),
            )
        except Exception as exc:
            hook.ping(run_id, "fail", body=repr(exc)[:1000])
            raise
        hook.ping(run_id, body=f"lag={beat['lag_seconds']:.1f}s")
        return beat

    beat()


heartbeat()
