"""Real Airflow processes for tests whose behaviour lives in the scheduler.

:class:`AirflowCluster` starts the api-server, scheduler (LocalExecutor), dag-processor and
triggerer as subprocesses on free loopback ports against the session's metadata database,
waits until the api-server reports every component healthy, and on :meth:`stop` ends every
process it started, grandchildren included (see :mod:`onceflow.testing.processes`).

If the process that started a cluster dies without stopping it (SIGKILL, SIGTERM, a crash, or a
forgotten ``stop()``), the cluster's watchdog sweeps it: a small process in its own session that
reads a pipe only this process writes, and sees EOF when that process is gone. We chose it over
``PR_SET_PDEATHSIG`` in a ``preexec_fn``: running Python between fork and exec can deadlock when
the parent has threads (an in-process emulator, a client pool), the signal follows the *thread*
that forked rather than the process, and it never reached the orphaned LocalExecutor workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import create_engine, text

from onceflow.testing.ports import free_port
from onceflow.testing.processes import exit_code_unreaped, harness_pids, start_ticks, terminate_marked

if TYPE_CHECKING:
    import pytest

    from onceflow.testing.airflow_env import AirflowTestEnv

#: Environment variable set in every process a cluster starts, so none is left behind at teardown.
MARKER = "ONCEFLOW_HARNESS_RUN"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# The health endpoint's part and the job type of each component that has them.
_HEALTH = {"scheduler": ("scheduler", "SchedulerJob"), "triggerer": ("triggerer", "TriggererJob"),
           "dag-processor": ("dag_processor", "DagProcessorJob")}  # fmt: skip
TERMINAL_RUN_STATES = frozenset({"success", "failed"})


class ClusterError(RuntimeError):
    """An Airflow component failed to start, died, or a wait timed out; the message has log tails."""


class AirflowCluster:
    """One running Airflow installation made of real processes.

    :param base_env: the session environment (``AIRFLOW_HOME``, metadata DB, ...).
    :param workdir: where component logs go.
    :param dags_folder: the DAG folder the components read (default: the session's).
    :param env: extra environment for every component and CLI call.
    :param parallelism: LocalExecutor slots.
    :param api_port: the api-server's port (default: a free one).
    :param components: the components to start (default all; ``("api-server",)`` for UI tests).
    """

    def __init__(
        self,
        base_env: dict[str, str],
        workdir: Path,
        *,
        dags_folder: Path | None = None,
        env: dict[str, str] | None = None,
        parallelism: int = 8,
        api_port: int | None = None,
        components: Iterable[str] = COMPONENTS,
    ) -> None:
        self.components = tuple(components)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api_port = api_port or free_port()
        self.marker = uuid.uuid4().hex
        self.env: dict[str, str] = {**os.environ, **base_env}
        self.env.update(
            {
                MARKER: self.marker,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.api_port}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(parallelism),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "3",
                "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
            }
        )
        if dags_folder is not None:
            self.env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
        if env:
            self.env.update(env)
        self.dags_folder = Path(self.env["AIRFLOW__CORE__DAGS_FOLDER"])
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        # Component name -> its ``airflow`` arguments and its own environment (beside self.env).
        self._specs: dict[str, tuple[list[str], dict[str, str]]] = {
            name: ([name], {}) for name in self.components
        }
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        # Components replaced by restart(): still unreaped, so their session ids stay ours.
        self._retired: list[subprocess.Popen[bytes]] = []
        # Session id (each component's pid) -> its start time; emptied once stop() has reaped.
        self._leaders: dict[int, int] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watch_pipe: IO[bytes] | None = None
        self._first_job_id = 0
        self._engine = create_engine(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> AirflowCluster:
        """Start every component and wait until the api-server reports them healthy.

        On any failure (a launch, the wait, Ctrl-C) everything started so far is stopped before
        the error propagates: ``with AirflowCluster(...)`` never runs ``__exit__`` if
        ``__enter__`` raises.
        """
        try:
            self._first_job_id = self._max_job_id()
            self._start_watchdog()
            for name in self._specs:
                self._launch(name)
            self.wait_healthy(timeout)
        except BaseException as exc:
            try:
                self.stop()
            except Exception as stop_exc:
                exc.add_note(f"onceflow: stop() after the failed start failed too: {stop_exc!r}")
            raise
        return self

    def _start_watchdog(self) -> None:
        read_fd, write_fd = os.pipe()  # both non-inheritable: no other child keeps the pipe open
        self._watch_pipe = open(write_fd, "wb", buffering=0)  # noqa: SIM115  # closed by stop()
        # Without the marker (or AIRFLOW_*) the watchdog is no target of its own sweep.
        env = {k: v for k, v in os.environ.items() if k != MARKER and not k.startswith("AIRFLOW")}
        try:
            with (self.workdir / "watchdog.log").open("wb") as log:
                self._watchdog = subprocess.Popen(
                    [sys.executable, "-m", "onceflow.testing.processes", MARKER, self.marker],
                    env=env,
                    stdin=read_fd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # out of reach of signals sent to our group
                )
        finally:
            os.close(read_fd)

    def _tell_watchdog(self, line: str) -> None:
        if self._watch_pipe is not None:
            with contextlib.suppress(BrokenPipeError):  # a dead watchdog only loses the net
                self._watch_pipe.write(f"{line}\n".encode())

    def _launch(self, name: str) -> None:
        args, own_env = self._specs[name]
        # No preexec_fn: Popen then execs straight from C (safe with threads in this process).
        # Appending: a restarted component's log follows its previous life's.
        with (self.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "airflow", *args],
                env={**self.env, **own_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._procs[name] = proc
        ticks = start_ticks(proc.pid)  # never None: the child stays unreaped until stop()
        if ticks is not None:
            self._leaders[proc.pid] = ticks
            self._tell_watchdog(f"session {proc.pid} {ticks}")

    def wait_healthy(self, timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | str = "no answer yet"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.api_url}/api/v2/monitor/health", timeout=5) as resp:
                    last = json.loads(resp.read())
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = repr(exc)
                time.sleep(0.5)
                continue
            # The health endpoint looks at the newest job of each type, which may be a previous
            # cluster's for a few seconds; also require this cluster's own running jobs.
            if (
                isinstance(last, dict)
                and all(
                    (last.get(part) or {}).get("status") == "healthy"
                    for part in ("metadatabase", *(_HEALTH[c][0] for c in self.components if c in _HEALTH))
                )
                and self._own_jobs_running()
            ):
                return last
            time.sleep(0.5)
        raise ClusterError(f"Airflow did not become healthy in {timeout}s: {last}\n{self.log_tails()}")

    def _max_job_id(self) -> int:
        try:
            rows = self.query("SELECT MAX(id) AS m FROM job")
        except Exception:  # the schema may not exist yet in a brand-new database
            return 0
        return int(rows[0]["m"] or 0)

    def _own_jobs_running(self) -> bool:
        rows = self.query(
            "SELECT DISTINCT job_type FROM job WHERE id > :first AND state = 'running'",
            first=self._first_job_id,
        )
        return {_HEALTH[c][1] for c in self.components if c in _HEALTH} <= {r["job_type"] for r in rows}

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            code = exit_code_unreaped(proc)
            if code is not None:
                raise ClusterError(f"{name} exited with {code}\n{self.log_tails()}")

    def stop(self) -> list[int]:
        """End every process of this cluster; returns the PIDs that needed SIGKILL.

        Safe to call again, and on a partly started cluster. Processes that survive even SIGKILL
        (stuck in the kernel) are reported by a warning and by :meth:`leftover_pids`; stop()
        gives up on them after bounded waits instead of hanging.
        """
        for proc in self._procs.values():
            if proc.returncode is None:  # unreaped, so its group id is still this component's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        killed = terminate_marked(MARKER, self.marker, grace=15.0, sessions=self._leaders)
        survivors = self.leftover_pids()
        if survivors:
            # Keep the leaders unreaped (their session ids stay ours) and the watchdog armed.
            warnings.warn(
                f"onceflow: cluster {self.marker}: processes survived SIGKILL: {survivors}",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            self._reap_leaders()
            self._retire_watchdog()
        self._engine.dispose()
        return killed

    def restart(self, *names: str, grace: float = 30.0, timeout: float = 180.0) -> None:
        """Stop the named components (SIGTERM to their whole session, SIGKILL after ``grace``),
        start them again, and wait until the cluster is healthy with a new job for each
        restarted scheduler, triggerer or dag-processor.

        What a deployment's rolling restart does; state that must survive it lives in the
        metadata DB (a task awaiting a human's input, a deferred task's trigger).
        """
        jobs = {"scheduler": "SchedulerJob", "triggerer": "TriggererJob", "dag-processor": "DagProcessorJob"}
        before = self._max_job_id()
        nobody = uuid.uuid4().hex  # the marker test must match nothing: only the session counts
        for name in names:
            proc = self._procs[name]
            session = {proc.pid: self._leaders.get(proc.pid, 0)}
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and harness_pids(MARKER, nobody, session):
                time.sleep(0.2)
            for pid in harness_pids(MARKER, nobody, session):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=10)  # the session is empty: reaping frees an id nobody else uses
            self._leaders.pop(proc.pid, None)
            self._launch(name)
        wanted = {jobs[n] for n in names if n in jobs}
        deadline = time.monotonic() + timeout
        while True:
            rows = self.query(
                "SELECT DISTINCT job_type FROM job WHERE id > :before AND state = 'running'", before=before
            )
            if wanted <= {r["job_type"] for r in rows}:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"{sorted(wanted)} did not come back in {timeout}s\n{self.log_tails()}")
            self._check_alive()
            time.sleep(0.5)
        self.wait_healthy(timeout)

    def _reap_leaders(self) -> None:
        for name, proc in [*((f"retired {p.pid}", p) for p in self._retired), *self._procs.items()]:
            try:
                proc.wait(timeout=10)  # dead already: this only collects the zombie
            except subprocess.TimeoutExpired:
                warnings.warn(
                    f"onceflow: {name} (pid {proc.pid}) could not be reaped", RuntimeWarning, stacklevel=3
                )
                return
        # Reaped leaders free their PIDs: from now on a session id could be someone else's.
        self._retired.clear()
        self._leaders.clear()

    def _retire_watchdog(self) -> None:
        if self._watch_pipe is not None:
            self._tell_watchdog("done")
            self._watch_pipe.close()
            self._watch_pipe = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._watchdog.wait(timeout=5)
                warnings.warn(
                    f"onceflow: watchdog {self._watchdog.pid} hung; killed", RuntimeWarning, stacklevel=3
                )
            self._watchdog = None

    def component_pids(self) -> dict[str, int]:
        """Each running component's process id (``scheduler``, ``api-server``, ...): its process tree's root."""
        return {name: proc.pid for name, proc in self._procs.items() if proc.returncode is None}

    def leftover_pids(self) -> list[int]:
        """Processes of this cluster still alive (empty after :meth:`stop`)."""
        return harness_pids(MARKER, self.marker, self._leaders)

    def __enter__(self) -> AirflowCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- diagnostics -------------------------------------------------------------------------

    def listeners(self) -> list[tuple[int, str, str, int]]:
        """Every TCP socket this cluster's processes listen on: (pid, command, address, port)."""
        import psutil

        pids = set(self.leftover_pids())
        found = []
        for conn in psutil.net_connections(kind="inet"):
            if conn.status != psutil.CONN_LISTEN or conn.pid not in pids:
                continue
            try:
                # as the process titles itself ("airflow serve-logs", "airflow api_server -- ...")
                command = " ".join(part for part in psutil.Process(conn.pid).cmdline() if part)
            except psutil.Error:  # it ended meanwhile
                continue
            found.append((conn.pid, command, conn.laddr.ip, conn.laddr.port))
        return sorted(found)

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for name in self._specs:
            path = self.workdir / f"{name}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name} ({path}) ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def task_log_tails(self, dag_id: str, *, lines: int = 60, ok_states: Iterable[str] = ("success",)) -> str:
        """The newest attempt's log of every task of ``dag_id`` not in ``ok_states`` (why it failed)."""
        parts = []
        for ti in self.task_instances(dag_id):
            if ti["state"] in set(ok_states):
                continue
            relative = Path(f"dag_id={dag_id}", f"run_id={ti['run_id']}", f"task_id={ti['task_id']}")
            folder = self.task_log_roots()[0] / relative
            attempts = sorted(
                (p for root in self.task_log_roots() for p in (root / relative).glob("attempt=*.log")),
                key=lambda p: p.stat().st_mtime,
            )
            head = f"--- {dag_id}/{ti['run_id']}/{ti['task_id']} is {ti['state']} (try {ti['try_number']})"
            if not attempts:
                parts.append(f"{head}: no log under {folder}")
                continue
            tail = attempts[-1].read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"{head}: {attempts[-1]}\n" + "\n".join(tail))
        return "\n".join(parts)

    def task_log_roots(self) -> list[Path]:
        """The folders task logs are written under (one per worker host in a distributed cluster)."""
        configured = self.env.get("AIRFLOW__LOGGING__BASE_LOG_FOLDER")
        return [Path(configured) if configured else Path(self.env["AIRFLOW_HOME"]) / "logs"]

    # -- commands ----------------------------------------------------------------------------

    def cli(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` against this cluster's configuration.

        On a SQLite metadata DB through :mod:`onceflow.sqlite_cli`: its transactions take the write
        lock first, so ``backfill create`` cannot commit half a backfill and then delete runs the
        scheduler already started (which killed the scheduler; see that module).
        """
        on_sqlite = self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite")
        proc = subprocess.run(
            [sys.executable, "-m", "onceflow.sqlite_cli" if on_sqlite else "airflow", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def query(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        """Read the metadata database directly (tests assert on what Airflow recorded)."""
        with self._engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(sql), params)]

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> None:
        """Wait until the dag-processor has parsed and serialized ``dag_id``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            rows = self.query(
                "SELECT d.is_paused FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id "
                "WHERE d.dag_id = :dag_id AND d.is_stale = :stale",
                dag_id=dag_id,
                stale=False,
            )
            if rows:
                return
            time.sleep(0.5)
        errors = self.query("SELECT filename, stacktrace FROM import_error")
        raise ClusterError(
            f"DAG {dag_id} was not parsed in {timeout}s; import errors: {errors}\n{self.log_tails()}"
        )

    def trigger(
        self,
        dag_id: str,
        *,
        conf: dict[str, Any] | None = None,
        run_id: str | None = None,
        logical_date: str | None = None,
    ) -> str:
        """Create a run the way a user would (``airflow dags trigger``); returns its run id."""
        self.wait_for_dag(dag_id)
        run_id = run_id or f"manual__onceflow_{uuid.uuid4().hex[:12]}"
        args = ["dags", "trigger", dag_id, "--run-id", run_id]
        if conf is not None:
            args += ["--conf", json.dumps(conf)]
        if logical_date is not None:
            args += ["--logical-date", logical_date]
        self.cli(*args)
        return run_id

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query(
            "SELECT state FROM dag_run WHERE dag_id = :dag_id AND run_id = :run_id",
            dag_id=dag_id,
            run_id=run_id,
        )
        return rows[0]["state"] if rows else None

    def wait_for_run(
        self,
        dag_id: str,
        run_id: str,
        *,
        timeout: float = 300.0,
        states: Iterable[str] = TERMINAL_RUN_STATES,
    ) -> str:
        """Wait until the run reaches one of ``states``; returns the state reached."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state: str | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            state = self.run_state(dag_id, run_id)
            if state in wanted:
                return state
            time.sleep(1.0)
        tis = self.task_instances(dag_id, run_id)
        raise ClusterError(
            f"run {dag_id}/{run_id} is {state} after {timeout}s; tasks: {tis}\n{self.log_tails()}"
        )

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT run_id, state, run_type, logical_date, data_interval_start, data_interval_end, "
            "start_date, end_date FROM dag_run WHERE dag_id = :dag_id ORDER BY logical_date, run_id",
            dag_id=dag_id,
        )

    def task_instances(self, dag_id: str, run_id: str | None = None) -> list[dict[str, Any]]:
        sql = (
            "SELECT task_id, run_id, map_index, state, try_number, pool, priority_weight, "
            "start_date, end_date FROM task_instance WHERE dag_id = :dag_id"
        )
        params: dict[str, Any] = {"dag_id": dag_id}
        if run_id is not None:
            sql += " AND run_id = :run_id"
            params["run_id"] = run_id
        return self.query(sql + " ORDER BY start_date, task_id", **params)


def set_pools(pools: dict[str, int]) -> None:
    """Create or resize pools in the metadata DB (slots only; deferred tasks hold no slot)."""
    from airflow.models.pool import Pool

    for name, slots in pools.items():
        Pool.create_or_update_pool(
            name=name, slots=slots, description="onceflow test pool", include_deferred=False
        )


def cluster_factory(
    db: AirflowTestEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., AirflowCluster]]:
    """The ``onceflow_airflow_cluster_factory`` fixture (``onceflow.testing.pytest_plugin``): every
    cluster it makes is stopped at teardown, and the test errors if any of its processes survived."""
    import pytest

    from onceflow.testing import postgres
    from onceflow.testing.celery_cluster import CeleryCluster

    made: list[AirflowCluster] = []

    def factory(
        *,
        dags_folder: Path | str | None = None,
        env: dict[str, str] | None = None,
        pools: dict[str, int] | None = None,
        parallelism: int = 8,
        timeout: float = 180.0,
        executor: str = "local",
        celery: dict[str, Any] | None = None,
    ) -> AirflowCluster:
        if executor not in {"local", "celery"}:
            raise ValueError(f"executor must be 'local' or 'celery', not {executor!r}")
        if executor == "celery" and not db.is_postgres:
            reason = (
                "the Celery topology needs a PostgreSQL metadata DB (two schedulers lock rows): "
                f"set {postgres.ENV_VAR}=postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
            )
            if postgres.postgres_required():
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        if pools:
            set_pools(pools)
        workdir = tmp_path_factory.mktemp(f"{executor}-cluster")
        folder = Path(dags_folder) if dags_folder else None
        cluster: AirflowCluster
        if executor == "celery":
            cluster = CeleryCluster(
                db.variables,
                workdir,
                dags_folder=folder,
                env=env,
                parallelism=parallelism,
                **(celery or {}),
            )
        else:
            cluster = AirflowCluster(
                db.variables, workdir, dags_folder=folder, env=env, parallelism=parallelism
            )
        made.append(cluster)
        return cluster.start(timeout=timeout)

    yield factory
    problems: list[str] = []
    for cluster in made:
        # Each in its own try: one failing stop() must not leave the other clusters running.
        try:
            cluster.stop()
        except Exception as exc:
            problems.append(f"{cluster.marker}: stop() failed: {exc!r}")
        if leftovers := cluster.leftover_pids():
            problems.append(f"{cluster.marker}: survived teardown: {leftovers}")
    if problems:
        pytest.fail("onceflow: Airflow cluster teardown: " + "; ".join(problems))
