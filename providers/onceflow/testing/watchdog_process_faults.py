"""Generated fault schedules over real ``onceflow-watchdog`` processes, checked by the same promises.

::

    from onceflow.testing.watchdog_process_faults import generate, run_schedule

    schedule = generate(seed=7)                       # a pure function of the seed
    outcome = run_schedule(schedule, tmp_path, ledger_url)   # a fresh PostgreSQL database
    assert not check_promises(outcome)                # onceflow.testing.watchdog_faults' promises

The in-process checker (:mod:`onceflow.testing.watchdog_faults`) drives replicas pass by pass on a
fake clock: fast and exact, but nothing there is killed, stopped or hung for real. Here every part
is real and runs on wall time, with periods of seconds:

* 2 or 3 replicas, each ``python -m onceflow.watchdog`` (the ``onceflow-watchdog`` program) with
  its own config and state file, some arriving late (their imports done beforehand, ``main``
  called at the arrival: on a loaded machine the imports alone take 10-30 s); ``SIGKILL``, ``SIGSTOP``/``SIGCONT`` and
  restarts (a new process on the same state file);
* the ledger is a PostgreSQL database reached through :class:`~onceflow.testing.tcp_proxy.
  FreezableProxy`: **hung** (the proxy frozen: connections open, no byte moves, which only the
  pass monitor catches), **down** (every connection cut, new ones closed at once) or **read-only**
  (``default_transaction_read_only`` on the database and the watchdog's sessions ended);
* the alert receiver is ``python -m onceflow.testing.alert_receiver`` as a process
  (:class:`~onceflow.testing.alert_receiver.AlertReceiverProcess`): **slow**
  (``/control/delay``), **refusing** (503), **down** (SIGKILLed, restarted on its port later) or
  **hung** (SIGSTOPped: the kernel takes connections and requests in, nothing answers; at SIGCONT
  it answers every one, their senders long gone; mixed schedules hang it as a DOWN is due);
* this process writes the heartbeats (straight to PostgreSQL, not through the proxy) of every
  check that is not silenced.

Three profiles: ``mixed`` (a random mix of every fault above over 1-4 checks), ``order`` (the
receiver refusing or down while checks go down and come back, then back: defect 2 of issue 28, a
RECOVERED overtaking its DOWN that waits out a backoff, needs that) and ``burst`` (12-14
checks silenced at once and resumed at once, a receiver answering each webhook 0.9 s late, one
replica sending the burst alone for longer than a lease and the others arriving in the middle of
it: defect 3 of issue 28, alerts sent twice without any crash when a burst was leased with one
clock read, needs exactly that).

After the schedule everything is made healthy, every replica started, and the run waits until the
shared outbox and every replica's own outbox are empty; then each replica's ``/status`` and
``/health`` (``[status] port``) must say all is readable, nothing blind, healthy, and each check's
last beat its own; the replicas get SIGTERM. What the receiver recorded (its JSONL file, times from its own clock) becomes an
:class:`~onceflow.testing.watchdog_faults.Outcome` and is checked by
:func:`~onceflow.testing.watchdog_faults.check_promises`. Since a process is killed from outside,
which keys were being sent when it died is not known exactly: an alert received twice (alone or
in groups) is excused as the crash window only if a replica was killed, stopped or re-executed
itself (a pass stuck for three budgets, read from its log) (or, for the shared outbox, the ledger
was out) between its first copy's send starting and its mark (``[t - delay - send timeout, t +
2 s]``), or a copy took the receiver within 0.5 s of the send timeout, or was read within
:data:`HANG_FLUSH` after a hang (its sender may have given up and retried: at-least-once). The
repeat must still carry its first copy's Idempotency-Key. The paging bound gets :data:`START_ALLOWANCE` for processes
starting and scheduling under load, and the slow receiver's queue.

:func:`replay` names the seed in its failure; the same seed gives the same schedule (the timing of
real processes, and so the exact messages, vary between replays).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiverProcess, read_records
from onceflow.testing.ports import free_port
from onceflow.testing.tcp_proxy import FreezableProxy
from onceflow.testing.watchdog_faults import (
    Event,
    Outcome,
    Timing,
    check_promises,
    copies_by_alert,
    status_problems,
)
from onceflow.watchdog.alerts import LEASE_MARGIN_SECONDS
from onceflow.watchdog.schema import alerts, ensure_schema, heartbeats, incidents

if TYPE_CHECKING:
    from collections.abc import Callable

LOOP = 0.5
PERIOD = 2.0
GRACE = 2.0
BEAT_EVERY = 0.5
SEND_TIMEOUT = 2.5
BACKOFF = 0.5
BACKOFF_MAX = 2.0
LEASE = SEND_TIMEOUT + LEASE_MARGIN_SECONDS
#: A pass longer than this is ``watchdog.blind.pass``; three of them and the process re-executes.
PASS_BUDGET = 3.0
#: In burst schedules: three of them outlast sending a burst alone (14 x 0.9 s, slower under
#: load), or the sender would re-execute itself mid-burst, a crash that excuses what it repeats.
BURST_PASS_BUDGET = 10.0
STATEMENT_TIMEOUT = 2.0
#: Added to every paging bound: a process's start (imports) and scheduling on a loaded machine.
START_ALLOWANCE = 6.0
#: From the receiver's acceptance to "mark sent" committed, under load.
MARK_ALLOWANCE = 2.0
#: After a stopped receiver goes on, how long it takes to read the requests queued meanwhile.
HANG_FLUSH = 2.0
SLOW = 0.9  # seconds per webhook: 8-12 of them outlast a lease (7.5 s), one stays inside a send

KINDS = (
    "silence",  # arg: checks whose beats stop
    "resume",  # arg: checks whose beats start again
    "kill",  # arg: replica; SIGKILL
    "stop",  # arg: replica; SIGSTOP
    "cont",  # arg: replica; SIGCONT
    "restart",  # arg: replica; SIGKILL if alive, then a new process on the same state file
    "ledger_down",  # every connection cut; followed by ledger_up
    "ledger_hang",  # the proxy frozen; followed by ledger_up
    "ledger_readonly",  # writes refused; followed by ledger_up
    "ledger_up",
    "receiver_slow",  # arg: seconds per webhook
    "receiver_refuse",  # 503
    "receiver_down",  # SIGKILL: connection refused
    "receiver_up",
    "receiver_hang",  # SIGSTOP: connections taken in, never answered (until receiver_up)
)


@dataclass(frozen=True)
class ProcessSchedule:
    """A generated schedule for real processes (times in seconds after the start)."""

    seed: int
    profile: str  # "mixed" or "burst"
    checks: tuple[str, ...]
    replicas: int
    #: When each replica first starts (0: running before the schedule begins).
    arrive: tuple[float, ...]
    duration: float
    events: tuple[Event, ...]
    flap_threshold: int = 0
    group_max: int = 50
    pass_budget: float = PASS_BUDGET


def generate(seed: int) -> ProcessSchedule:
    """A schedule that is a pure function of ``seed``."""
    rng = random.Random(seed)
    pick = rng.random()
    if pick < 0.35:
        return _burst(seed, rng)
    if pick < 0.55:
        return _order(seed, rng)
    return _mixed(seed, rng)


def _order(seed: int, rng: random.Random) -> ProcessSchedule:
    # Defect 2 of issue 28 needs this: a DOWN refused and waiting out its backoff while the check
    # comes back, then the receiver back (a RECOVERED must not overtake its DOWN).
    checks = tuple(f"c{i}" for i in range(rng.randint(1, 3)))
    replicas = rng.randint(2, 3)
    out_at = round(rng.uniform(0.5, 3.0), 1)
    down_at = round(out_at + rng.uniform(0.0, 2.0), 1)
    up_at = round(down_at + PERIOD + GRACE + rng.uniform(1.0, 5.0), 1)
    back_at = round(up_at + rng.uniform(-1.0, 3.0), 1)
    silenced = sorted(rng.sample(checks, rng.randint(1, len(checks))))
    events = [
        Event(out_at, rng.choice(("receiver_refuse", "receiver_down"))),
        Event(down_at, "silence", silenced),
        Event(up_at, "resume", silenced),
        Event(max(back_at, down_at + PERIOD + GRACE + 1.0), "receiver_up"),
    ]
    if rng.random() < 0.5:  # and a second round, the receiver slow this time
        again = round(up_at + rng.uniform(3.0, 6.0), 1)
        events += [
            Event(again - 0.5, "receiver_slow", 0.3),
            Event(again, "silence", silenced),
            Event(round(again + PERIOD + GRACE + rng.uniform(1.0, 3.0), 1), "resume", silenced),
        ]
    return ProcessSchedule(
        seed=seed,
        profile="order",
        checks=checks,
        replicas=replicas,
        arrive=(0.0,) * replicas,
        duration=round(max(e.at for e in events) + 3.0, 1),
        events=tuple(sorted(events, key=lambda e: e.at)),
        flap_threshold=0,
        group_max=rng.choice((1, 50)),
    )


def _burst(seed: int, rng: random.Random) -> ProcessSchedule:
    # One replica sends a burst alone for longer than a lease; the others arrive in the middle of
    # it, after the first rows' leases would have run out had they all been taken at its start.
    checks = tuple(f"c{i}" for i in range(rng.randint(12, 14)))
    replicas = rng.randint(2, 3)
    down_at = round(rng.uniform(0.5, 2.0), 1)
    burst = len(checks) * SLOW  # how long one replica alone needs for it
    up_at = round(down_at + PERIOD + GRACE + burst + rng.uniform(1.0, 3.0), 1)
    into = rng.choice((down_at + PERIOD + GRACE, up_at))  # the DOWN burst or the RECOVERED one
    arrive = (0.0, *(round(into + rng.uniform(3.5, 6.0), 1) for _ in range(replicas - 1)))
    events = [
        Event(0.2, "receiver_slow", SLOW),
        Event(down_at, "silence", list(checks)),
        Event(up_at, "resume", list(checks)),
    ]
    return ProcessSchedule(
        seed=seed,
        profile="burst",
        checks=checks,
        replicas=replicas,
        arrive=arrive,
        duration=round(max(up_at, *arrive) + burst + 2.0, 1),
        events=tuple(sorted(events, key=lambda e: e.at)),
        flap_threshold=0,
        group_max=1,  # a grouped burst is one message; grouping is in the mixed schedules
        pass_budget=BURST_PASS_BUDGET,
    )


def _mixed(seed: int, rng: random.Random, duration: float = 24.0) -> ProcessSchedule:
    checks = tuple(f"c{i}" for i in range(rng.randint(1, 4)))
    replicas = rng.randint(2, 3)
    arrive = tuple(
        0.0 if i == 0 or rng.random() < 0.6 else round(rng.uniform(2, 12), 1) for i in range(replicas)
    )
    events: list[Event] = []
    t = 0.0
    ledger_free_at = 0.0
    while True:
        t += rng.expovariate(1 / 2.0)
        if t >= duration:
            break
        kind = rng.choices(KINDS[:-1], weights=(6, 5, 1, 1, 1, 2, 1, 1, 1, 0, 1, 1, 1, 2))[0]
        arg: Any = None
        if kind in ("silence", "resume"):
            arg = sorted(rng.sample(checks, rng.randint(1, len(checks))))
        elif kind in ("kill", "stop", "cont", "restart"):
            arg = rng.randrange(replicas)
        elif kind == "receiver_slow":
            arg = rng.choice((0.3, SLOW))
        elif kind.startswith("ledger_"):
            if t < ledger_free_at:
                continue  # one store outage at a time
            # A hang long enough to re-execute (three budgets) now and then.
            length = rng.uniform(2.0, 14.0 if kind == "ledger_hang" else 8.0)
            ledger_free_at = t + length
            events.append(Event(round(t + length, 1), "ledger_up"))
        events.append(Event(round(t, 1), kind, arg))
    flap_threshold, group_max = rng.choice((0, 0, 3)), rng.choice((1, 50))
    silences = [e.at for e in events if e.kind == "silence" and e.at < duration - PERIOD - GRACE - 3.0]
    if silences and rng.random() < 0.6:  # drawn last: the faults above are the seed's before hangs
        # Hung as a silence's DOWN is due, so its sends meet it.
        hang = round(rng.choice(silences) + PERIOD + GRACE - rng.uniform(0.0, 1.5), 1)
        events += [Event(hang, "receiver_hang"), Event(round(hang + rng.uniform(2.0, 7.0), 1), "receiver_up")]
    return ProcessSchedule(
        seed=seed,
        profile="mixed",
        checks=checks,
        replicas=replicas,
        arrive=arrive,
        duration=duration,
        events=tuple(sorted(events, key=lambda e: e.at)),
        flap_threshold=flap_threshold,
        group_max=group_max,
    )


# -- running -----------------------------------------------------------------------------------


# The same program as ``python -m onceflow.watchdog`` (its main, re-executing itself the same way).
_GATED = """
import pathlib, sys, time
import onceflow.watchdog.__main__ as watchdog
gate = pathlib.Path(sys.argv[1])
while not gate.exists():
    time.sleep(0.02)
sys.exit(watchdog.main(sys.argv[2:]))
"""


class _Replica:
    def __init__(self, index: int, config: Path, log: Path) -> None:
        self.index = index
        self.config = config
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False
        self._passes_before = self._reexecs = 0
        self._ready = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def working(self) -> bool:
        """Running, not stopped, and done with a pass since it (re)started: imports alone take
        seconds, tens of seconds on a loaded machine."""
        if not self.alive or self.stopped:
            return False
        passes, reexecs = self.scan()
        if reexecs > self._reexecs:  # it re-executed itself: a new start
            self._reexecs, self._passes_before, self._ready = reexecs, passes, False
        if not self._ready:
            self._ready = passes > self._passes_before
        return self._ready

    def scan(self) -> tuple[int, int]:
        """Passes logged, and re-executions logged, so far."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count(" pass: "), text.count("re-executing the watchdog")

    def start(self, gate: Path | None = None) -> None:
        """Start ``onceflow-watchdog``; with ``gate``, its imports done first and ``main`` called
        when the file appears (a replica that arrives at a given moment, not seconds later)."""
        args = ["--config", str(self.config)]
        command = [sys.executable, "-m", "onceflow.watchdog", *args]
        if gate is not None:
            command = [sys.executable, "-c", _GATED, str(gate), *args]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.stopped = False
        self._passes_before, self._reexecs = self.scan()
        self._ready = False

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self.stopped = False

    def passes(self) -> int:
        return self.scan()[0]


class _Run:
    def __init__(self, schedule: ProcessSchedule, workdir: Path, ledger_url: str) -> None:
        self.s = schedule
        self.dir = workdir
        self.url = sa.engine.make_url(ledger_url)
        self.database = self.url.database
        self.world = sa.create_engine(ledger_url, pool_pre_ping=True)

        @sa.event.listens_for(self.world, "connect")
        def _writable(dbapi_connection: Any, _record: Any) -> None:
            # The test's own writes (beats) go on while the ledger is read-only for the watchdog.
            with dbapi_connection.cursor() as cur:
                cur.execute("SET default_transaction_read_only = off")

        ensure_schema(self.world)
        self.proxy = FreezableProxy(self.url.host or "127.0.0.1", self.url.port or 5432).start()
        proxied = self.url.set(host="127.0.0.1", port=self.proxy.port)
        self.proxied = proxied.render_as_string(hide_password=False)
        self.receiver = AlertReceiverProcess(workdir / "received.jsonl", control_token=os.urandom(12).hex())
        self.receiver.start()
        self.receiver_state = "up"
        self.refusing = False  # answering 503 (kept through a hang)
        self.hangs: list[tuple[float, float]] = []  # when the receiver was stopped
        self.slow = 0.0
        self.max_slow = 0.0
        self.status_ports = [free_port() for _ in range(schedule.replicas)]
        self.status_problems: list[str] = []
        self.replicas = [self._replica(i) for i in range(schedule.replicas)]
        self.t0 = 0.0
        self.lock = threading.Lock()
        self.silent: dict[str, float] = {}
        self.last_beat: dict[str, float] = {}
        self.silences: list[tuple[str, float, float]] = []
        self.crashes: list[tuple[float, float]] = []  # replicas killed or stopped
        self.stopped_since: dict[int, float] = {}
        self.ledger_state = "up"
        self.ledger_since = 0.0
        self.ledger_out: list[tuple[float, float]] = []
        self.receiver_since = 0.0
        self.unavailable: list[tuple[float, float]] = []
        self._nobody_since: float | None = None
        self.log: list[str] = []
        self.beat_seq = 0
        self._beating = threading.Event()

    def now(self) -> float:
        return time.time() - self.t0

    # -- parts ---------------------------------------------------------------------------------

    def _replica(self, i: int) -> _Replica:
        config = self.dir / f"r{i}.toml"
        checks = "".join(
            f"""
[checks.{c}]
kind = "heartbeat"
dag_id = "{c}"
period_seconds = {PERIOD}
grace_seconds = {GRACE}
max_lag_seconds = 600
flap_threshold = {self.s.flap_threshold}
flap_window_seconds = 600
"""
            for c in self.s.checks
        )
        config.write_text(
            f"""ledger_url = "{self.proxied}"
state_dir = "{self.dir / f"state-r{i}"}"
loop_seconds = {LOOP}
pass_budget_seconds = {self.s.pass_budget}
statement_timeout_seconds = {STATEMENT_TIMEOUT}
replica = "r{i}"

[alerts]
webhook_url = "http://127.0.0.1:{self.receiver.port}/webhook"
send_timeout_seconds = {SEND_TIMEOUT}
backoff_seconds = {BACKOFF}
backoff_max_seconds = {BACKOFF_MAX}
max_attempts = 1000
reminder_seconds = 3600
group_max = {self.s.group_max}

[status]
port = {self.status_ports[i]}
{checks}"""
        )
        return _Replica(i, config, self.dir / f"r{i}.log")

    def _beat_loop(self) -> None:
        while not self._beating.wait(BEAT_EVERY):
            now = time.time()
            with self.lock:
                due = [c for c in self.s.checks if c not in self.silent]
            rows = []
            for c in due:
                self.beat_seq += 1
                rows.append(
                    {
                        "run_id": f"{c}-{self.beat_seq}",
                        "dag_id": c,
                        "scheduled_at": now,
                        "started_at": now,
                        "lag_seconds": 0.0,
                        "try_number": 1,
                    }
                )
            if not rows:
                continue
            try:
                with self.world.begin() as conn:
                    conn.execute(heartbeats.insert(), rows)
            except sa.exc.DBAPIError as exc:
                self.log.append(f"t={self.now():.1f} beat failed: {exc!s:.200}")
                continue
            with self.lock:
                for c in due:
                    if c not in self.silent:
                        self.last_beat[c] = now - self.t0

    # -- events --------------------------------------------------------------------------------

    def apply(self, e: Event) -> None:
        t = self.now()
        self.log.append(f"t={t:.1f} (at {e.at}) {e.kind} {e.arg if e.arg is not None else ''}")
        if e.kind == "silence":
            with self.lock:
                for c in e.arg:
                    self.silent.setdefault(c, self.last_beat.get(c, 0.0))
        elif e.kind == "resume":
            with self.lock:
                for c in e.arg:
                    if c in self.silent:
                        self.silences.append((c, self.silent.pop(c), t))
        elif e.kind == "arrive":
            (self.dir / f"arrive-r{e.arg}").touch()
        elif e.kind in ("kill", "stop", "cont", "restart"):
            self._replica_event(e.kind, self.replicas[e.arg], t)
        elif e.kind.startswith("ledger_"):
            self._set_ledger(e.kind.removeprefix("ledger_"), t)
        elif e.kind == "receiver_slow":
            if self.receiver_state in ("up", "refuse"):  # a stopped or dead one gets it when back
                self.receiver.control(f"delay?seconds={e.arg}")
            self.slow = e.arg
            self.max_slow = max(self.max_slow, e.arg)
        else:
            self._set_receiver(e.kind.removeprefix("receiver_"), t)

    def _replica_event(self, kind: str, r: _Replica, t: float) -> None:
        if kind == "stop" and r.alive and not r.stopped:
            r.signal(signal.SIGSTOP)
            r.stopped = True
            self.stopped_since[r.index] = t
        elif kind == "cont" and r.stopped:
            self._cont(r, t)
        elif kind in ("kill", "restart"):
            if r.alive:
                if r.stopped:
                    self._cont(r, t)
                r.kill()
                self.crashes.append((t, t))
            if kind == "restart":
                r.start()

    def _cont(self, r: _Replica, t: float) -> None:
        r.signal(signal.SIGCONT)
        r.stopped = False
        self.crashes.append((self.stopped_since.pop(r.index, t), t))

    def _set_ledger(self, state: str, t: float) -> None:
        if state == self.ledger_state:
            return
        if self.ledger_state == "up":
            self.ledger_since = t
        # Leave the old state first: a cut before a thaw, so held bytes never reach the server.
        if self.ledger_state == "down":
            self.proxy.restore()
        elif self.ledger_state == "hang":
            self.proxy.cut()
            self.proxy.thaw()
            self.proxy.restore()
        elif self.ledger_state == "readonly":
            self._readonly(False)
        if state == "down":
            self.proxy.cut()
        elif state == "hang":
            self.proxy.freeze()
        elif state == "readonly":
            self._readonly(True)
        else:
            self.ledger_out.append((self.ledger_since, t))
        self.ledger_state = state

    def _readonly(self, on: bool) -> None:
        with self.world.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            setting = (
                "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
            )
            conn.execute(sa.text(f'ALTER DATABASE "{self.database}" {setting}'))
            # Sessions keep the setting they started with: end the watchdog's, they reconnect.
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :db AND application_name = 'onceflow-watchdog'"
                ),
                {"db": self.database},
            )

    def _set_receiver(self, state: str, t: float) -> None:
        if state == self.receiver_state:
            return
        if self.receiver_state == "up":
            self.receiver_since = t
        # Leave the old state: a dead one started again (answering, as it starts), a stopped one
        # continued (it answers what was queued meanwhile, senders long gone: see _excused).
        if self.receiver_state == "down":
            self.receiver.start()
            self.refusing = False
            if self.slow:
                self.receiver.control(f"delay?seconds={self.slow}")
        elif self.receiver_state == "hang":
            self.receiver.resume()
            self.hangs.append((self.receiver_since, t))
        if state == "down":
            self.receiver.kill()
        elif state == "hang":
            self.receiver.pause()
        elif state == "refuse":
            self.receiver.control("down")
            self.refusing = True
        else:
            if self.refusing:
                self.receiver.control("up")
                self.refusing = False
            self.unavailable.append((self.receiver_since, t))
        self.receiver_state = state

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> Outcome:
        beater = threading.Thread(target=self._beat_loop, name="beats", daemon=True)
        self.t0 = time.time()
        try:
            beater.start()
            first = [r for r in self.replicas if self.s.arrive[r.index] == 0.0]
            for r in self.replicas:
                late = self.s.arrive[r.index] > 0
                r.start(gate=self.dir / f"arrive-r{r.index}" if late else None)
            _wait(lambda: all(r.passes() > 0 for r in first), 300, "the first replicas' first pass")
            self.t0 = time.time()
            with self.lock:
                self.last_beat = dict.fromkeys(self.s.checks, 0.0)
            pending = sorted(
                [*self.s.events, *(Event(at, "arrive", i) for i, at in enumerate(self.s.arrive) if at > 0)],
                key=lambda e: e.at,
            )
            while self.now() < self.s.duration:
                while pending and pending[0].at <= self.now():
                    self.apply(pending.pop(0))
                self._watch_replicas()
                time.sleep(0.1)
            self.settle()
            self.status_problems = self.check_status()
            if self._nobody_since is not None:
                self.unavailable.append((self._nobody_since, self.now()))
        finally:
            self._beating.set()
            for r in self.replicas:
                if r.stopped:
                    r.signal(signal.SIGCONT)
                r.signal(signal.SIGTERM)
            for r in self.replicas:
                if r.proc is not None:
                    try:
                        r.proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        r.kill()
            self.receiver.kill()
            self.proxy.stop()
        return self.outcome()

    def _watch_replicas(self) -> None:
        """Record when no replica was working (the paging bound waits that long)."""
        t = self.now()
        working = any(r.working for r in self.replicas)
        if not working and self._nobody_since is None:
            self._nobody_since = t
        elif working and self._nobody_since is not None:
            self.unavailable.append((self._nobody_since, t))
            self._nobody_since = None

    def settle(self) -> None:
        """Everything healthy and every replica running, until both outboxes are empty."""
        t = self.now()
        self.log.append(f"t={t:.1f} settle")
        self._set_ledger("up", t)
        self._set_receiver("up", t)
        self.receiver.control("delay?seconds=0")
        for r in self.replicas:
            (self.dir / f"arrive-r{r.index}").touch()
            if r.stopped:
                self._cont(r, t)
            if not r.alive:
                r.start()
        with self.lock:
            for c in list(self.silent):
                self.silences.append((c, self.silent[c], float("inf")))  # still silent at the end
            # A check still silent goes down during the settling: its page must be queued first.
            until = max(
                [
                    t + 4 * LOOP + BACKOFF_MAX,
                    *(last + PERIOD + GRACE + 4 * LOOP for last in self.silent.values()),
                ]
            )
        started = time.monotonic()
        calm = 0
        after: dict[int, int] | None = None  # each replica's passes when `until` came
        while time.monotonic() - started < 180:
            time.sleep(LOOP)
            self._watch_replicas()
            if self.now() < until:
                continue
            if after is None:
                after = {r.index: r.passes() for r in self.replicas}
            if any(r.passes() < after[r.index] + 2 for r in self.replicas):
                # Every replica judges the settled world (pages of checks still silent, recoveries,
                # blindness cleared) in a whole pass before an empty outbox means anything.
                continue
            calm = calm + 1 if self._queued() == 0 else 0
            if calm >= 3:
                return
        self.log.append("settle: the outboxes did not drain within 180 s")

    def check_status(self) -> list[str]:
        """Each replica's ``/status`` and ``/health`` after the settling (see
        :func:`~onceflow.testing.watchdog_faults.status_problems`). A pass over its budget on this
        loaded machine is briefly blind and unhealthy, rightly: each replica gets 30 s to say
        all is well, and what it said last counts."""
        out = []
        for r in self.replicas:
            problems = ["no answer"]
            deadline = time.monotonic() + 30
            while problems and time.monotonic() < deadline:
                try:
                    before = self._newest_beats()
                    report = _get_json(self.status_ports[r.index], "/status")
                    after = self._newest_beats()
                    ok = _get_json(self.status_ports[r.index], "/health")
                    problems = status_problems(report, (ok["ok"], ok["reason"]), before, after)
                except (OSError, ValueError, KeyError) as exc:
                    problems = [f"status API: {exc!r:.200}"]
                if problems:
                    time.sleep(1.0)
            out += [f"r{r.index} {p}" for p in problems]
        return out

    def _newest_beats(self) -> dict[str, float]:
        with self.world.connect() as conn:
            rows = conn.execute(
                sa.select(heartbeats.c.dag_id, sa.func.max(heartbeats.c.started_at)).group_by(
                    heartbeats.c.dag_id
                )
            ).all()
        return {dag: float(at) for dag, at in rows}

    def _queued(self) -> int:
        with self.world.connect() as conn:
            n: int = conn.execute(
                sa.select(sa.func.count()).select_from(alerts).where(alerts.c.state == "queued")
            ).scalar_one()
        for state in self.dir.glob("state-r*/watchdog-local.db"):
            engine = sa.create_engine(f"sqlite:///{state}")
            try:
                with engine.connect() as conn:
                    n += conn.execute(
                        sa.select(sa.func.count()).select_from(alerts).where(alerts.c.state == "queued")
                    ).scalar_one()
            except sa.exc.OperationalError:
                n += 1  # being created or locked: not settled yet
            finally:
                engine.dispose()
        return n

    def outcome(self) -> Outcome:
        messages = []
        for r in read_records(self.receiver.store):
            if r["kind"] != "webhook" or r.get("refused"):
                continue
            m = {"key": r["idempotency_key"], "t": r["received_at"] - self.t0, **r["message"]["onceflow"]}
            m["took"] = r["received_at"] - r.get("arrived_at", r["received_at"])
            messages.append(m)
        with self.world.connect() as conn:
            final = {r.check_name: dict(r._mapping) for r in conn.execute(sa.select(incidents))}
        self.world.dispose()
        # A pass stuck for three budgets re-executes its process: a crash of the watchdog's own.
        for replica in self.replicas:
            for t in _reexecs(replica.log):
                self.crashes.append((t - self.t0, t - self.t0))
                self.log.append(f"t={t - self.t0:.1f} r{replica.index} re-executed itself (a pass stuck)")
        excused = {
            key for key, cs in copies_by_alert(messages).items() if len(cs) > 1 and self._excused(key, cs)
        }
        timing = Timing(
            period=PERIOD,
            grace=GRACE,
            loop=LOOP,
            backoff_max=BACKOFF_MAX,
            lease=LEASE,
            extra=START_ALLOWANCE + self.max_slow * (len(self.s.checks) + 3),
        )
        return Outcome(
            self.s,  # type: ignore[arg-type]  # the promises read its checks and flap_threshold
            messages,
            excused,
            final,
            self.silences,
            self.unavailable,
            self.ledger_out,
            self.log,
            timing,
            self.status_problems,
        )

    def _excused(self, key: str, copies: list[dict[str, Any]]) -> bool:
        """An alert received twice (alone or in groups) is the crash window (see the module
        docstring), or a send its sender may have given up on: held by the receiver close to the
        deadline, or queued by the kernel while the receiver was stopped and read when it went on."""
        if any(m["took"] > SEND_TIMEOUT - 0.5 for m in copies):
            return True
        read = [m["t"] - m["took"] for m in copies]
        if any(a <= r <= b + HANG_FLUSH for r in read for a, b in self.hangs):
            return True
        first = copies[0]["t"]
        lo, hi = first - self.max_slow - SEND_TIMEOUT - 0.5, first + MARK_ALLOWANCE
        outages = list(self.crashes)
        if not key.startswith("watchdog.blind."):  # the shared outbox is in the ledger
            outages += self.ledger_out
        return any(a <= hi and b >= lo for a, b in outages)


def _get_json(port: int, path: str) -> Any:
    """GET a replica's status API; a 503's body is the answer too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as exc:
        return json.load(exc)


def _reexecs(log: Path) -> list[float]:
    """When a replica's log says it re-executed itself (epoch seconds; the log's local asctime)."""
    found = []
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            if "re-executing the watchdog" in line:
                stamp, _, ms = line[:23].partition(",")
                with contextlib.suppress(ValueError):
                    found.append(time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000)
    return found


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_schedule(schedule: ProcessSchedule, workdir: Path, ledger_url: str) -> Outcome:
    """Run ``schedule`` in ``workdir`` against ``ledger_url`` (a fresh PostgreSQL database)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return _Run(schedule, workdir, ledger_url).run()


def replay(seed: int, workdir: Path, ledger_url: str) -> Outcome:
    """Generate, run and check one seed; raise ``AssertionError`` naming the seed on a violation."""
    schedule = generate(seed)
    outcome = run_schedule(schedule, workdir, ledger_url)
    problems = check_promises(outcome)
    if problems:
        tails = "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:]
            for p in sorted(workdir.glob("r[0-9]*.log"))
        )
        raise AssertionError(
            f"watchdog real-process schedule seed={seed} ({schedule.profile}) broke {len(problems)} "
            f"promise(s) (replay: onceflow.testing.watchdog_process_faults.replay({seed}, tmp_path, url)):\n  "
            + "\n  ".join(problems)
            + "\nschedule:\n  "
            + "\n  ".join(outcome.log[-60:])
            + "\nreceived:\n  "
            + "\n  ".join(f"t={m['t']:.1f} {m['key']}" for m in outcome.messages[-40:])
            + f"\nreplica logs (tails):\n{tails}"
        )
    return outcome


def summary(outcome: Outcome) -> dict[str, Any]:
    """What a run exercised (for a test's assertion that the schedule did something)."""
    kinds = [m.get("kind") for m in outcome.messages]
    return {
        "messages": len(outcome.messages),
        "kinds": sorted(set(map(str, kinds))),
        "excused_duplicates": len(outcome.crashed_keys),
        "log": json.dumps(outcome.log[-5:]),
    }


__all__ = ["ProcessSchedule", "generate", "replay", "run_schedule", "summary"]
