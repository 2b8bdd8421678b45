"""One watchdog pass, the long-running loop, and the one-shot exit codes.

Each pass: evaluate every due check, move its incident by compare-and-set, deliver queued
alerts, then ping the watchdog's own heartbeat URL (who watches the watchdog) if the pass finished
within its budget.

No store can hang the loop. Every database call has a deadline (PostgreSQL: ``connect_timeout``,
``statement_timeout``, ``lock_timeout``, TCP keepalives and ``tcp_user_timeout``, a pool checkout
timeout; SQLite: ``busy_timeout``), every HTTP call a total one. What no deadline can bound (a TCP
peer that ACKs and never answers: a frozen proxy, a stopped PostgreSQL backend) is caught by the
:class:`PassMonitor`, a thread that does not share the stuck call's resources: a pass running past
``pass_budget`` is a blindness incident ``watchdog.blind.pass``, recorded in this replica's own
SQLite file with the host clock and delivered from there; the self-heartbeat, pinged only at the
end of a pass, stops too, so the outside monitor pages as well; the CLI's loop re-executes itself
when a pass stays stuck for three budgets. Incidents and the outbox live
in the ledger database, shared by every replica. What the watchdog cannot evaluate (the ledger
or warehouse unreachable, the sheet unreadable) is a *blindness* incident, kept in a small
SQLite file of this replica (``state_dir``) with its own outbox, because the shared store may be
exactly what is gone; each replica reports its own blindness once per incident, restarts
included.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger.clock import DatabaseClock
from onceflow.watchdog import checks, incidents
from onceflow.watchdog.alerts import Outbox, ping
from onceflow.watchdog.config import CheckConfig
from onceflow.watchdog.incidents import DOWN, FAILING, LATE, UP, Verdict
from onceflow.watchdog.schema import ensure_schema, local_meta

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Engine

    from onceflow.watchdog.config import WatchdogConfig

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILING, EXIT_CONFIG, EXIT_BLIND = 0, 1, 2, 3
LOCAL_DB = "watchdog-local.db"
#: Checks that call an outside API (the Sheets quota, the api-server): evaluated once per period.
POLLED_AT_PERIOD = frozenset({"api_health", "sheet_queue"})


@dataclass
class PassResult:
    """What one pass found: each check's state and the sources it could not read."""

    states: dict[str, str] = field(default_factory=dict)
    blind: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The ``--once`` exit code: 3 blind, 1 a check not up, 0 all up."""
        if self.blind:
            return EXIT_BLIND
        return EXIT_FAILING if any(s != UP for s in self.states.values()) else EXIT_OK


class Watchdog:
    """The checks of one config, evaluated against ``clock()`` (seconds since the epoch).

    :param clock: a time source for tests. Default: the ledger database's clock, so replicas on
        hosts whose clocks disagree judge (and lease alerts) on one time line, as the ledger
        does; this host's clock only while the ledger cannot be read (blindness, kept locally).
    :param sheets_service: a Sheets client to use instead of building one (tests).
    """

    def __init__(
        self,
        config: WatchdogConfig,
        *,
        clock: Callable[[], float] | None = None,
        sheets_service: Any | None = None,
    ) -> None:
        self.config = config
        self.clock: Callable[[], float] = clock or self._database_now
        #: The clock of what this replica records alone (blindness): never the stuck store's.
        self.local_clock: Callable[[], float] = clock or steady_wall_clock()
        self._db_clock: DatabaseClock | None = None
        self.owner = config.replica or f"{socket.gethostname()}:{os.getpid()}"
        self.outbox = Outbox(config.alerts, self.owner)
        self._sheets_service = sheets_service
        self._ledger: Engine | None = None
        self._warehouse: Engine | None = None
        self._schema_ready = False
        self._next_due: dict[str, float] = {}
        self._api_said: str | None = None
        #: When the running pass started (monotonic) and what it is doing, for the monitor.
        self.pass_started: float | None = None
        self.pass_phase = "idle"
        self.last_pass: dict[str, Any] = {}
        #: When the last finished pass started (monotonic: /health's age survives clock steps).
        self.last_pass_monotonic: float | None = None
        self._local_lock = threading.Lock()
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.local, scope = open_state_file(config.state_dir / LOCAL_DB)
        self.local_outbox = Outbox(config.alerts, self.owner, key_scope=scope)
        #: Sources with an open blindness incident (this process is the only writer of the file).
        self._blind_open: set[str] | None = {
            name.removeprefix("watchdog.blind.")
            for name, i in incidents.read_all(self.local).items()
            if i.state in (LATE, DOWN)
        }

    # -- engines -----------------------------------------------------------------------------

    def _engine(self, url: str) -> Engine:
        return bounded_engine(url, self.config.statement_timeout)

    @property
    def ledger(self) -> Engine:
        """The engine on the ledger database, its watchdog tables created on first use."""
        if self._ledger is None:
            self._ledger = self._engine(self.config.ledger_url)
        if not self._schema_ready:
            ensure_schema(self._ledger)
            self._schema_ready = True
        return self._ledger

    @property
    def warehouse(self) -> Engine:
        """The engine on the warehouse (for ``business_freshness``)."""
        if self._warehouse is None:
            assert self.config.warehouse_url is not None
            self._warehouse = self._engine(self.config.warehouse_url)
        return self._warehouse

    def _database_now(self) -> float:
        # No fallback to this host's clock: a pass (or a lease) on a skewed host clock would judge
        # fresh beats dead, or write leases already expired; unreadable, the pass is blind.
        if self._db_clock is None:
            self._db_clock = DatabaseClock(self.ledger)
        return self._db_clock.now()

    # -- one pass ----------------------------------------------------------------------------

    def run_once(self, *, only_due: bool = False) -> PassResult:
        """Evaluate every (or every due) check, apply the transitions, deliver alerts."""
        self.pass_started, started_at = time.monotonic(), self.local_clock()
        try:
            result = self._pass(only_due=only_due)
        finally:
            elapsed = time.monotonic() - (self.pass_started or time.monotonic())
            self.last_pass_monotonic = self.pass_started
            self.pass_started, self.pass_phase = None, "idle"
        self.last_pass = {
            "started_at": started_at,
            "seconds": round(elapsed, 3),
            "states": dict(result.states),
            "blind": dict(result.blind),
        }
        if self.config.self_heartbeat_url and elapsed <= self.config.pass_budget:
            # At the end, and only after a pass in budget: a stuck or overrunning pass stops the
            # beat, so the outside monitor pages even if this replica's own alerts cannot go out.
            ping(self.config.self_heartbeat_url, timeout=3.0, body=f"replica={self.owner}")
        return result

    def _pass(self, *, only_due: bool) -> PassResult:
        result = PassResult()
        now = self.local_clock()
        try:
            self.pass_phase = "reading the ledger clock"
            now = self.clock()
            self.pass_phase = "probing the ledger"
            ledger: Engine | None = self.ledger
            with ledger.connect() as conn:  # type: ignore[union-attr]
                conn.execute(sa.text("SELECT 1"))
        except Exception as exc:
            ledger = None
            self._blind("ledger", f"ledger database unreachable: {_short(exc)}", now, result)
        failed_channels: set[str] = set()  # a channel that failed once waits for the next pass
        if ledger is not None:
            for check in self.config.checks:
                # Ledger/warehouse reads are cheap: judged every pass, so an alert comes within
                # period + grace (+ one loop). Calls to outside APIs keep to their own period.
                polled = check.kind in POLLED_AT_PERIOD
                if only_due and polled and self._next_due.get(check.name, 0.0) > now:
                    continue
                self._next_due[check.name] = now + check.period
                self.pass_phase = f"evaluating {check.name}"
                try:
                    verdict = self._evaluate(check, ledger, now)
                except Exception as exc:
                    self._blind(check.name, f"cannot evaluate {check.name}: {_short(exc)}", now, result)
                    continue
                self._clear_blind(check.name, now)
                self.pass_phase = f"recording {check.name}"
                try:
                    stored = incidents.apply(ledger, check, verdict, self.outbox, now=now, actor=self.owner)
                except Exception as exc:  # the ledger went away between the probe and the write
                    self._blind("ledger", f"cannot record {check.name}: {_short(exc)}", now, result)
                    continue
                result.states[check.name] = stored.state
            self.pass_phase = "delivering alerts"
            try:
                self.outbox.deliver(ledger, self.clock, failed_channels=failed_channels)
            except Exception as exc:
                self._blind("ledger", f"alert outbox unreachable: {_short(exc)}", now, result)
            if "ledger" not in result.blind:
                # Only a whole pass clears it: a ledger that answers SELECT 1 but refuses writes
                # (read-only standby, full disk) would otherwise flip late -> up every pass, never down.
                self._clear_blind("ledger", now)
        # This pass got here: a stuck pass reported by the monitor of an earlier process (it
        # re-executed itself, or was restarted) is over; that monitor never saw it end.
        self._clear_blind("pass", self.local_clock())
        self.pass_phase = "delivering blindness alerts"
        self.deliver_local(failed_channels)
        return result

    def deliver_local(self, failed_channels: set[str] | None = None) -> None:
        """Deliver this replica's own (blindness) alerts; the monitor thread calls it too."""
        with self._local_lock:
            self.local_outbox.deliver(self.local, self.local_clock, failed_channels=failed_channels)

    def _evaluate(self, check: CheckConfig, ledger: Engine, now: float) -> Verdict:
        if check.kind == "heartbeat":
            current = incidents.get_or_create(ledger, check.name, now, self.owner)
            verdict = checks.heartbeat(check, ledger, now, current)
            if self._api_said is not None:
                # Shown beside the heartbeat's evidence, never instead of it.
                verdict.evidence["api_server_health"] = self._api_said
            return verdict
        if check.kind == "api_health":
            health = checks.api_health(check, now)
            self._api_said = health.reason
            return health
        if check.kind == "business_freshness":
            return checks.business_freshness(check, self.warehouse, now)
        if check.kind == "article_queue":
            return checks.article_queue(check, ledger, now)
        if check.kind == "sheet_queue":
            return checks.sheet_queue(check, ledger, now, self._sheets_service)
        raise ValueError(f"unknown check kind {check.kind!r}")

    # -- blindness ---------------------------------------------------------------------------

    def _blind_check(self, source: str) -> CheckConfig:
        # Down after two passes without sight: one failed read is not yet an outage.
        return CheckConfig(
            name=f"watchdog.blind.{source}",
            kind="blind",
            period=self.config.loop_seconds,
            grace=self.config.loop_seconds * 2,
            runbook=f"{self.config.runbook_base}#runbook-watchdog-blind",
        )

    def _blind(
        self, source: str, reason: str, now: float, result: PassResult | None, *, down: bool = False
    ) -> None:
        """Record blindness in this replica's own file, judged by the host clock (the ledger's may
        be what is gone; ``now`` is unused for that reason and kept for the callers' symmetry)."""
        log.error("BLIND: %s", reason)
        if result is not None:
            result.blind[source] = reason
        check = self._blind_check(source)
        verdict = Verdict(DOWN if down else FAILING, reason, {"replica": self.owner, "source": source})
        if self._blind_open is not None:
            self._blind_open.add(source)
        with self._local_lock:
            incidents.apply(
                self.local, check, verdict, self.local_outbox, now=self.local_clock(), actor=self.owner
            )

    def _clear_blind(self, source: str, now: float) -> None:
        if self._blind_open is not None and source not in self._blind_open:
            return  # nothing open for it: no read of the local file on every pass
        check = self._blind_check(source)
        with self._local_lock:
            with self.local.connect() as conn:
                current = incidents.read(conn, check.name)
            if self._blind_open is not None:
                self._blind_open.discard(source)
            if current is not None and current.state in (LATE, DOWN):
                verdict = Verdict(UP, f"{source} readable again", {"replica": self.owner, "source": source})
                incidents.apply(
                    self.local, check, verdict, self.local_outbox, now=self.local_clock(), actor=self.owner
                )

    def blind_states(self) -> dict[str, Any]:
        """This replica's open blindness incidents (for the status API)."""
        with self._local_lock:
            return {
                name: {"state": i.state, "since": i.since, "incident": i.incident, "reason": i.reason}
                for name, i in incidents.read_all(self.local).items()
                if i.state != UP
            }

    # -- loop --------------------------------------------------------------------------------

    def run_forever(
        self, *, stop: Callable[[], bool] = lambda: False, on_stuck: Callable[[float], None] | None = None
    ) -> None:
        """Loop until ``stop()``; a pass that raises is logged and the loop goes on.

        :param on_stuck: called by the monitor with the seconds a pass has been stuck, once it
            passes three budgets (the CLI re-executes itself there).
        """
        monitor = PassMonitor(self, on_stuck=on_stuck)
        monitor.start()
        try:
            self._loop(stop)
        finally:
            monitor.stop()

    def _loop(self, stop: Callable[[], bool]) -> None:
        while not stop():
            started = time.monotonic()
            try:
                result = self.run_once(only_due=True)
                log.info("pass: %s%s", result.states, f" BLIND {result.blind}" if result.blind else "")
            except Exception:
                log.exception("watchdog pass failed; next pass in %.0f s", self.config.loop_seconds)
            while not stop() and time.monotonic() - started < self.config.loop_seconds:
                time.sleep(min(0.5, self.config.loop_seconds))


class PassMonitor(threading.Thread):
    """Raises ``watchdog.blind.pass`` when a pass overruns its budget, without the stuck call.

    It reads only the pass's start time (a float the pass sets), writes only this replica's own
    SQLite file with the host clock, and delivers from there with the HTTP total deadline. When the
    stuck pass finally ends, the incident recovers.
    """

    def __init__(
        self, watchdog: Watchdog, *, on_stuck: Callable[[float], None] | None = None, tick: float = 0.25
    ) -> None:
        super().__init__(name="onceflow-watchdog-monitor", daemon=True)
        self.watchdog = watchdog
        self.on_stuck = on_stuck
        self.tick = tick
        self._stop = threading.Event()
        self.reported: float | None = None  # the start of the pass reported stuck

    def stop(self) -> None:
        """Stop watching the passes."""
        self._stop.set()

    def run(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                self.check()
            except Exception:  # the monitor must outlive anything it reports
                log.exception("watchdog monitor: check failed")

    def check(self) -> None:
        """Report a pass that has run longer than its budget (once per pass)."""
        wd = self.watchdog
        budget = wd.config.pass_budget
        started = wd.pass_started
        if started is not None:
            stuck = time.monotonic() - started
            if stuck > budget and self.reported != started:
                self.reported = started
                wd._blind(
                    "pass",
                    f"a watchdog pass has run {stuck:.0f} s (budget {budget:.0f} s), stuck {wd.pass_phase}; "
                    "nothing it checks is current",
                    wd.local_clock(),
                    None,
                    down=True,
                )
                wd.deliver_local()
            if stuck > 3 * budget and self.on_stuck is not None:
                self.on_stuck(stuck)
        elif self.reported is not None:
            self.reported = None
            wd._clear_blind("pass", wd.local_clock())
            wd.deliver_local()


def steady_wall_clock() -> Callable[[], float]:
    """This host's time when called, carried forward by the monotonic clock: a step of the host's
    clock (NTP, a resumed VM, a hand) does not move it while the process lives. Blindness is judged
    on it: with the wall clock stepped an hour back, a blind replica stayed "late" for that hour."""
    wall, steady = time.time(), time.monotonic()
    return lambda: wall + (time.monotonic() - steady)


def bounded_engine(url: str, seconds: float) -> Engine:
    """An engine whose every call has a deadline of about ``seconds`` (see the module docstring)."""
    from sqlalchemy import event

    from onceflow.ledger.db import create_ledger_engine, postgres_socket_deadlines

    ms = int(seconds * 1000)
    if url.startswith("postgresql"):
        connect_args: dict[str, Any] = {
            **postgres_socket_deadlines(seconds),
            "options": f"-c statement_timeout={ms} -c lock_timeout={ms} "
            f"-c idle_in_transaction_session_timeout={ms * 3}",
            "application_name": "onceflow-watchdog",
        }
        return create_ledger_engine(url, pool_pre_ping=True, pool_timeout=seconds, connect_args=connect_args)
    engine = create_ledger_engine(url)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _busy(dbapi_connection: Any, _record: Any) -> None:
            # After the ledger's own listener (60 s): a locked file must not hold a pass that long.
            dbapi_connection.execute(f"PRAGMA busy_timeout = {ms}")

    return engine


def open_state_file(path: Path) -> tuple[Engine, str]:
    """This replica's SQLite file and its random id (created once; scopes blindness alert keys).

    A file that is not a database (truncated, overwritten) is moved aside with a loud log line and
    a new one started: it holds only this replica's blindness incidents, and a watchdog that
    refuses to start over it would be silent.
    """
    from onceflow.ledger.db import create_ledger_engine

    for attempt in range(2):
        engine = create_ledger_engine(f"sqlite:///{path}")
        try:
            ensure_schema(engine)
            with engine.begin() as conn:
                scope = conn.execute(
                    sa.select(local_meta.c.value).where(local_meta.c.key == "scope")
                ).scalar()
                if scope is None:
                    scope = uuid.uuid4().hex[:12]
                    conn.execute(local_meta.insert().values(key="scope", value=scope))
            return engine, str(scope)
        except sa.exc.DatabaseError as exc:
            engine.dispose()
            if attempt:
                raise StateFileError(path, exc) from None
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(f"{path}{suffix}")
                if src.exists():
                    src.rename(f"{aside}{suffix}")
            log.error(
                "state file %s is not a usable SQLite database (%s): moved to %s and started a new one; "
                "blindness incidents open in it are forgotten (the ledger's incidents are not affected)",
                path,
                _short(exc),
                aside,
            )
    raise AssertionError("unreachable")


class StateFileError(OSError):
    """The state file is unusable even after moving it aside (a read-only directory, a full disk)."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        super().__init__(
            f"state file {path} cannot be used ({_short(exc)}); fix the permissions or free space of "
            f"{path.parent}, or point state_dir elsewhere"
        )


def _short(exc: BaseException) -> str:
    from onceflow.redact import redact_text

    text = redact_text(f"{type(exc).__name__}: {exc}")
    return text.splitlines()[0][:300] if text else repr(exc)
