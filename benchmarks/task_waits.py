"""Where a task process waits: Execution API messages, SQL statements and commits, fsyncs.

:func:`install` patches, in the process it runs in (a task process, through the benchmark's
listener plugin, or a ``dag.test()`` run), the three places a daily_sales task waits on
something else, and keeps a count and the wall seconds of each kind:

* ``api:<Message>``: every message the task sends its supervisor (``GetConnection``,
  ``GetXCom``, ``SetXCom``, ``GetVariable``, ``SucceedTask``, ...): each is an Execution API round
  trip (the supervisor forwards it over HTTP);
* ``sql:connect``, ``sql:execute``, ``sql:commit``: SQLAlchemy connection opens (new DBAPI
  connections), statements and commits on every engine of the process;
* ``os:fsync``: every ``os.fsync``.

:func:`snapshot` returns ``{kind: [count, seconds]}``. The overhead is a ``perf_counter`` pair per
event. Standard library and SQLAlchemy only; nothing here changes what the task does.
"""

from __future__ import annotations

import cProfile
import os
import time
from collections import defaultdict
from typing import Any

_totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_installed = False
#: Set (to anything): also count each task-side statement by its text (``bench_task_waits --statements``).
STATEMENTS_ENV = "ONCEFLOW_TASK_WAITS_STATEMENTS"
#: A folder: also profile each task run with cProfile into ``<task_id>-<n>.pstats`` there.
PROFILE_ENV = "ONCEFLOW_TASK_WAITS_PROFILE"
_in_api = [0]  # SQL run while a message is being answered is the API server's (dag.test runs it here)


def _add(kind: str, seconds: float) -> None:
    if _in_api[0] and kind.startswith("sql:"):
        kind = "api-side " + kind
    entry = _totals[kind]
    entry[0] += 1
    entry[1] += seconds


def _timed(kind_of: Any, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(kind_of(*args, **kwargs), time.perf_counter() - started)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Patch the comms, SQLAlchemy and ``os.fsync`` of this process (once)."""
    global _installed
    if _installed:
        return
    _installed = True

    from airflow.sdk.execution_time import comms, supervisor

    def message(_self: Any, msg: Any = None, **kwargs: Any) -> str:
        return "api:" + type(msg if msg is not None else kwargs.get("msg")).__name__

    def api(fn: Any) -> Any:
        timed = _timed(message, fn)

        def send(*args: Any, **kwargs: Any) -> Any:
            _in_api[0] += 1
            try:
                return timed(*args, **kwargs)
            finally:
                _in_api[0] -= 1

        return send

    comms.CommsDecoder.send = api(comms.CommsDecoder.send)  # type: ignore[method-assign]
    supervisor.InProcessSupervisorComms.send = api(supervisor.InProcessSupervisorComms.send)  # type: ignore[method-assign]
    os.fsync = _timed(lambda *_a, **_k: "os:fsync", os.fsync)

    import sqlalchemy as sa
    from sqlalchemy import event

    statements = bool(os.environ.get(STATEMENTS_ENV))

    started: dict[int, float] = {}

    @event.listens_for(sa.engine.Engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
        started[id(cursor)] = time.perf_counter()

    @event.listens_for(sa.engine.Engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
        t0 = started.pop(id(cursor), None)
        if t0 is not None:
            _add("sql:execute", time.perf_counter() - t0)
            if statements and not _in_api[0]:
                _add("  sql: " + " ".join(str(statement).split())[:110], time.perf_counter() - t0)

    @event.listens_for(sa.engine.Engine, "commit")
    def _commit(conn: Any) -> None:
        _add("sql:commit", 0.0)  # counted here; its time is inside the DBAPI commit below

    from sqlalchemy.engine import default

    dialect = default.DefaultDialect
    dialect.do_commit = _timed(lambda *_a, **_k: "sql:commit (DBAPI)", dialect.do_commit)  # type: ignore[method-assign]
    dialect.connect = _timed(lambda *_a, **_k: "sql:connect", dialect.connect)  # type: ignore[method-assign]


def by_task_runs() -> list[tuple[str, float, dict[str, list[float]]]]:
    """With :func:`install_by_task`: ``(task_id, wall s of task_runner.run, waits)`` per task run."""
    return list(_runs)


_runs: list[tuple[str, float, dict[str, list[float]]]] = []


def install_by_task() -> None:
    """:func:`install`, and split the waits by task: each ``task_runner.run`` call starts afresh.

    For ``dag.test()``, which runs every task in the calling process (``from task_runner import
    run`` inside the in-process supervisor, so the module attribute is what it calls).
    """
    install()
    from airflow.sdk.execution_time import task_runner

    original = task_runner.run

    profiles = os.environ.get(PROFILE_ENV)

    def run(ti: Any, *args: Any, **kwargs: Any) -> Any:
        reset()
        profiler = cProfile.Profile() if profiles else None
        started = time.perf_counter()
        try:
            if profiler is None:
                return original(ti, *args, **kwargs)
            return profiler.runcall(original, ti, *args, **kwargs)
        finally:
            _runs.append((ti.task_id, time.perf_counter() - started, snapshot()))
            if profiler is not None and profiles:
                profiler.dump_stats(os.path.join(profiles, f"{ti.task_id}-{len(_runs)}.pstats"))

    task_runner.run = run


def snapshot() -> dict[str, list[float]]:
    """``{kind: [count, seconds]}`` since :func:`install` (or the last :func:`reset`)."""
    return {k: [v[0], v[1]] for k, v in sorted(_totals.items())}


def reset() -> None:
    _totals.clear()
