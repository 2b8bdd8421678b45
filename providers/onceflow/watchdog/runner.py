"""One watchdog pass, the long-running loop, and the one-shot exit codes.

Each pass: ping the watchdog's own heartbeat URL (who watches the watchdog), evaluate every due
check, move its incident by compare-and-set, deliver queued alerts. Incidents and the outbox live
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
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger.clock import DatabaseClock
from onceflow.watchdog import checks, incidents
from onceflow.watchdog.alerts import Outbox, ping
from onceflow.watchdog.config import CheckConfig
from onceflow.watchdog.incidents import DOWN, FAILING, LATE, UP, Verdict
from onceflow.watchdog.schema import ensure_schema

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
    states: dict[str, str] = field(default_factory=dict)
    blind: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
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
        self._db_clock: DatabaseClock | None = None
        self.owner = config.replica or f"{socket.gethostname()}:{os.getpid()}"
        self.outbox = Outbox(config.alerts, self.owner)
        self._sheets_service = sheets_service
        self._ledger: Engine | None = None
        self._warehouse: Engine | None = None
        self._schema_ready = False
        self._next_due: dict[str, float] = {}
        self._api_said: str | None = None
        config.state_dir.mkdir(parents=True, exist_ok=True)
        from onceflow.ledger.db import create_ledger_engine

        self.local = create_ledger_engine(f"sqlite:///{config.state_dir / LOCAL_DB}")
        ensure_schema(self.local)

    # -- engines -----------------------------------------------------------------------------

    def _engine(self, url: str) -> Engine:
        from onceflow.ledger.db import create_ledger_engine

        timeout = {"connect_timeout": 5} if url.startswith("postgresql") else {}
        return (
            create_ledger_engine(url, pool_pre_ping=True, connect_args=timeout)
            if timeout
            else create_ledger_engine(url)
        )

    @property
    def ledger(self) -> Engine:
        if self._ledger is None:
            self._ledger = self._engine(self.config.ledger_url)
        if not self._schema_ready:
            ensure_schema(self._ledger)
            self._schema_ready = True
        return self._ledger

    @property
    def warehouse(self) -> Engine:
        if self._warehouse is None:
            assert self.config.warehouse_url is not None
            self._warehouse = self._engine(self.config.warehouse_url)
        return self._warehouse

    def _database_now(self) -> float:
        try:
            if self._db_clock is None:
                self._db_clock = DatabaseClock(self.ledger)
            return self._db_clock.now()
        except Exception as exc:  # blind: the runner reports it; judge locally meanwhile
            log.warning("ledger clock unreadable (%s); using this host's clock", _short(exc))
            return time.time()

    # -- one pass ----------------------------------------------------------------------------

    def run_once(self, *, only_due: bool = False) -> PassResult:
        """Evaluate every (or every due) check, apply the transitions, deliver alerts."""
        now = self.clock()
        result = PassResult()
        if self.config.self_heartbeat_url:
            ping(self.config.self_heartbeat_url, timeout=3.0, body=f"replica={self.owner}")
        try:
            ledger: Engine | None = self.ledger
            with ledger.connect() as conn:  # type: ignore[union-attr]
                conn.execute(sa.text("SELECT 1"))
        except Exception as exc:
            ledger = None
            self._blind("ledger", f"ledger database unreachable: {_short(exc)}", now, result)
        if ledger is not None:
            for check in self.config.checks:
                # Ledger/warehouse reads are cheap: judged every pass, so an alert comes within
                # period + grace (+ one loop). Calls to outside APIs keep to their own period.
                polled = check.kind in POLLED_AT_PERIOD
                if only_due and polled and self._next_due.get(check.name, 0.0) > now:
                    continue
                self._next_due[check.name] = now + check.period
                try:
                    verdict = self._evaluate(check, ledger, now)
                except Exception as exc:
                    self._blind(check.name, f"cannot evaluate {check.name}: {_short(exc)}", now, result)
                    continue
                self._clear_blind(check.name, now)
                try:
                    stored = incidents.apply(ledger, check, verdict, self.outbox, now=now, actor=self.owner)
                except Exception as exc:  # the ledger went away between the probe and the write
                    self._blind("ledger", f"cannot record {check.name}: {_short(exc)}", now, result)
                    continue
                result.states[check.name] = stored.state
            try:
                self.outbox.deliver(ledger, self.clock())
            except Exception as exc:
                self._blind("ledger", f"alert outbox unreachable: {_short(exc)}", now, result)
            if "ledger" not in result.blind:
                # Only a whole pass clears it: a ledger that answers SELECT 1 but refuses writes
                # (read-only standby, full disk) would otherwise flip late -> up every pass, never down.
                self._clear_blind("ledger", now)
        self.outbox.deliver(self.local, self.clock())
        return result

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

    def _blind(self, source: str, reason: str, now: float, result: PassResult) -> None:
        log.error("BLIND: %s", reason)
        result.blind[source] = reason
        check = self._blind_check(source)
        verdict = Verdict(FAILING, reason, {"replica": self.owner, "source": source})
        incidents.apply(self.local, check, verdict, self.outbox, now=now, actor=self.owner)

    def _clear_blind(self, source: str, now: float) -> None:
        check = self._blind_check(source)
        with self.local.connect() as conn:
            current = incidents.read(conn, check.name)
        if current is not None and current.state in (LATE, DOWN):
            verdict = Verdict(UP, f"{source} readable again", {"replica": self.owner, "source": source})
            incidents.apply(self.local, check, verdict, self.outbox, now=now, actor=self.owner)

    # -- loop --------------------------------------------------------------------------------

    def run_forever(self, *, stop: Callable[[], bool] = lambda: False) -> None:
        """Loop until ``stop()``; a pass that raises is logged and the loop goes on."""
        while not stop():
            started = time.monotonic()
            try:
                result = self.run_once(only_due=True)
                log.info("pass: %s%s", result.states, f" BLIND {result.blind}" if result.blind else "")
            except Exception:
                log.exception("watchdog pass failed; next pass in %.0f s", self.config.loop_seconds)
            while not stop() and time.monotonic() - started < self.config.loop_seconds:
                time.sleep(min(0.5, self.config.loop_seconds))


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0][:300] if text else repr(exc)
