"""Airflow's distributed topology as real processes on one machine: CeleryExecutor, HA schedulers.

:class:`CeleryCluster` is an :class:`~onceflow.testing.airflow_cluster.AirflowCluster` (same
lifecycle, watchdog, ``stop()`` and queries) made of the api-server, the dag-processor, the
triggerer, **two schedulers** (HA mode: both schedule the same DAGs, row locks on PostgreSQL keep
them apart) and **two Celery workers** (``airflow celery worker``) taking tasks from the Redis
broker on 127.0.0.1:6379. Celery results go to the metadata PostgreSQL (``db+postgresql...``).

Each worker is its own "host": a private ``AIRFLOW_HOME``, ``HOME``, ``TMPDIR``, task-log
folder and log-server port, so nothing one task leaves on a worker's local disk is visible to a
task on the other worker. Only the DAG folder is shared, as a deployed image would be.

Parallel test sessions share the Redis server: every key of a cluster's broker carries the prefix
``onceflow-<marker>:`` (kombu's ``global_keyprefix``) and its tasks go to its own queue, so one
session's workers never take another's tasks.

:meth:`CeleryCluster.kill` SIGKILLs every process of one component (a worker's task processes
included, as when its host dies) and :meth:`CeleryCluster.relaunch` starts it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from onceflow.loopback_logs import write_local_settings
from onceflow.testing.airflow_cluster import AirflowCluster, ClusterError
from onceflow.testing.ports import free_port
from onceflow.testing.processes import exit_code_unreaped, session_members

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
#: How fast a dead process is noticed (defaults are 5 to 10 minutes; tests kill on purpose).
RECOVERY_SETTINGS = {
    # a task whose process stopped heartbeating (its worker was killed) fails into its retry
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    # a task queued in Celery but never started (the message died with its worker) is re-queued
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "90",
    # a dead scheduler's job is declared dead, and its tasks adopted by the other, quickly
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
}


class CeleryCluster(AirflowCluster):
    """api-server, dag-processor, triggerer, ``schedulers`` schedulers and ``workers`` Celery workers.

    :param base_env: the session environment; its metadata DB must be PostgreSQL.
    :param workdir: component logs, and each worker's private home.
    :param worker_concurrency: task slots per worker.
    :param broker_url: the Redis broker (keys prefixed per cluster).
    Other parameters as :class:`AirflowCluster` (``parallelism`` bounds the scheduler's queue).
    """

    def __init__(
        self,
        base_env: dict[str, str],
        workdir: Path,
        *,
        dags_folder: Path | None = None,
        env: dict[str, str] | None = None,
        parallelism: int = 16,
        schedulers: int = 2,
        workers: int = 2,
        worker_concurrency: int = 4,
        broker_url: str = DEFAULT_BROKER,
        api_port: int | None = None,
    ) -> None:
        metadata = {**os.environ, **base_env}.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        if not metadata.startswith("postgresql"):
            raise ClusterError(
                "CeleryCluster needs a PostgreSQL metadata database (several schedulers lock rows "
                f"with SELECT ... FOR UPDATE SKIP LOCKED; SQLite cannot), got {metadata.split(':', 1)[0]!r}. "
                "Set ONCEFLOW_TEST_DATABASE_URL=postgresql+psycopg2://postgres@127.0.0.1:5432/postgres."
            )
        super().__init__(
            base_env, workdir, dags_folder=dags_folder, env=env, parallelism=parallelism, api_port=api_port
        )
        queue = f"onceflow-{self.marker[:12]}"
        celery_env = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata}",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__GLOBAL_KEYPREFIX": f"{queue}:",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(worker_concurrency),
            **RECOVERY_SETTINGS,
        }
        # The caller's env still wins (a test may want other timeouts).
        self.env.update({**celery_env, **(env or {})})
        self.queue = queue
        self.scheduler_names = [f"scheduler-{n}" for n in range(1, schedulers + 1)]
        self.worker_names = [f"worker-{n}" for n in range(1, workers + 1)]
        self._specs = {
            "api-server": (["api-server"], {}),
            **{name: (["scheduler"], {}) for name in self.scheduler_names},
            "dag-processor": (["dag-processor"], {}),
            "triggerer": (["triggerer"], {}),
        }
        for name in self.worker_names:
            self._specs[name] = (
                ["celery", "worker", "--celery-hostname", f"{name}-{self.marker[:8]}@%h", "--queues", queue],
                self._private_host(name),
            )
        self._log_offsets: dict[str, int] = {}

    def _private_host(self, name: str) -> dict[str, str]:
        """A worker's own home, temporary folder, task logs and log-server port (a host of its own)."""
        root = self.workdir / name
        paths = {key: root / key.lower() for key in ("AIRFLOW_HOME", "HOME", "TMPDIR", "logs")}
        for path in paths.values():
            path.mkdir(parents=True, exist_ok=True)
        # Its log server listens on 127.0.0.1 (Airflow's binds every interface): nothing of a test
        # cluster or of `make run` answers from outside this machine.
        write_local_settings(paths["AIRFLOW_HOME"])
        return {
            "AIRFLOW_HOME": str(paths["AIRFLOW_HOME"]),
            "HOME": str(paths["HOME"]),
            "TMPDIR": str(paths["TMPDIR"]),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(paths["logs"]),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        }

    def worker_home(self, name: str) -> Path:
        """The private ``AIRFLOW_HOME`` of worker ``name``."""
        return Path(self._specs[name][1]["AIRFLOW_HOME"])

    def task_log_roots(self) -> list[Path]:
        return [Path(self._specs[name][1]["AIRFLOW__LOGGING__BASE_LOG_FOLDER"]) for name in self.worker_names]

    def start(self, timeout: float = 180.0) -> CeleryCluster:
        broker = urlsplit(self.env["AIRFLOW__CELERY__BROKER_URL"])
        try:
            socket.create_connection((broker.hostname or "127.0.0.1", broker.port or 6379), timeout=5).close()
        except OSError as exc:
            raise ClusterError(f"the Celery broker {broker.geturl()} is not reachable: {exc}") from exc
        super().start(timeout)
        return self

    def stop(self) -> list[int]:
        killed = super().stop()
        if not self.leftover_pids():
            self.drop_broker_keys()
        return killed

    def broker_keys(self) -> list[str]:
        """This cluster's keys on the Redis broker (all under its prefix)."""
        import redis

        client = redis.Redis.from_url(self.env["AIRFLOW__CELERY__BROKER_URL"])
        try:
            return [k.decode() for k in client.scan_iter(match=f"{self.queue}:*")]
        finally:
            client.close()

    def drop_broker_keys(self) -> None:
        """Delete this cluster's broker keys (queues, bindings, unacked messages of killed workers)."""
        import redis

        client = redis.Redis.from_url(self.env["AIRFLOW__CELERY__BROKER_URL"])
        try:
            for key in client.scan_iter(match=f"{self.queue}:*"):
                client.delete(key)
        finally:
            client.close()

    # -- health --------------------------------------------------------------------------------

    def _launch(self, name: str) -> None:
        path = self.workdir / f"{name}.log"
        self._log_offsets[name] = path.stat().st_size if path.exists() else 0
        super()._launch(name)

    def _own_jobs_running(self) -> bool:
        return (
            super()._own_jobs_running()
            and self._schedulers_live()
            and all(self._worker_ready(name) for name in self.worker_names)
        )

    def _schedulers_live(self) -> bool:
        """One freshly heartbeating SchedulerJob of this cluster per scheduler process."""
        rows = self.query(
            "SELECT count(*) AS n FROM job WHERE id > :first AND job_type = 'SchedulerJob' "
            "AND state = 'running' AND latest_heartbeat > now() - interval '8 seconds'",
            first=self._first_job_id,
        )
        return int(rows[0]["n"]) >= len(self.scheduler_names)

    def _worker_ready(self, name: str) -> bool:
        """Celery prints ``<node> ready.`` once it consumes from the queue (this life's log only)."""
        with (self.workdir / f"{name}.log").open("rb") as log:
            log.seek(self._log_offsets.get(name, 0))
            return b" ready." in log.read()

    # -- failures --------------------------------------------------------------------------------

    def pid(self, name: str) -> int:
        """The process id of component ``name`` (its session's leader)."""
        return self._procs[name].pid

    def kill(self, name: str, *, timeout: float = 30.0) -> list[int]:
        """SIGKILL every process of component ``name`` at once (its host died); returns their PIDs.

        A worker's task processes die with it: they are in its session. The leader stays
        unreaped (its session id stays ours) until :meth:`stop`; the component is down (not
        watched by the health checks) until :meth:`relaunch`.
        """
        proc = self._procs.pop(name)
        self._retired.append(proc)
        victims = session_members(proc.pid)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not session_members(proc.pid) and exit_code_unreaped(proc) is not None:
                return victims
            time.sleep(0.2)
        raise ClusterError(f"{name}: processes {session_members(proc.pid)} survived SIGKILL")

    def relaunch(self, name: str, *, timeout: float = 180.0) -> None:
        """Start component ``name`` again after :meth:`kill` and wait until it is back at work.

        (:meth:`restart` is the graceful one: SIGTERM, then start again.)
        """
        if name in self._procs:
            raise ClusterError(f"{name} (pid {self._procs[name].pid}) is running; kill() it first")
        since = self._max_job_id()
        self._launch(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if name in self.worker_names and self._worker_ready(name):
                return
            if name in self.scheduler_names and self._new_scheduler_job(since):
                return
            if name not in self.worker_names and name not in self.scheduler_names:
                self.wait_healthy(timeout)
                return
            time.sleep(0.5)
        raise ClusterError(f"{name} did not come back in {timeout}s\n{self.log_tails()}")

    def _new_scheduler_job(self, since: int) -> bool:
        rows = self.query(
            "SELECT count(*) AS n FROM job WHERE id > :since AND job_type = 'SchedulerJob' AND state = 'running'",
            since=since,
        )
        return int(rows[0]["n"]) > 0

    def scheduler_jobs(self) -> list[dict[str, Any]]:
        """This cluster's SchedulerJobs (one per scheduler life), oldest first."""
        return self.query(
            "SELECT id, state, hostname, start_date, end_date, latest_heartbeat FROM job "
            "WHERE id > :first AND job_type = 'SchedulerJob' ORDER BY id",
            first=self._first_job_id,
        )
