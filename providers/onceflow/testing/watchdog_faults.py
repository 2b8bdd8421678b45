"""A seeded fault-schedule checker for the watchdog: generate a schedule, run it, check the promises.

::

    from onceflow.testing.watchdog_faults import generate, run_schedule, check_promises

    schedule = generate(seed=17)                 # a pure function of the seed
    outcome = run_schedule(schedule, tmp_path)   # real SQLite ledger, real HTTP receiver, fake clock
    assert not check_promises(outcome), ...      # or: replay(17, tmp_path) raises with the seed

A schedule is a list of :class:`Event` at fake times: heartbeats of some checks stop and resume
(several at once), replicas crash (mid-send: after the receiver accepted, before "mark sent"),
stall and restart, the ledger goes away or turns read-only and comes back, the receiver is slow,
refuses (503) or is down (connection refused). Replicas are in-process :class:`Watchdog` objects
sharing one SQLite ledger, each with its own state file, driven pass by pass on one
:class:`~onceflow.testing.clock.FakeClock`; the receiver records the fake time of each accepted
message. After the schedule, a settle phase (everything healthy, every replica back) lets the
outbox drain. :func:`check_promises` then checks, over what the receiver got:

1. **paged in time**: every silence long enough to be an outage was paged (a DOWN, a FLAPPING, a
   group listing the check, or a blindness alert while the ledger was unreadable) within
   period + grace + two loops + the time the receiver or every replica was unavailable + the
   longest backoff + one lease (+ period + grace with flap damping on, the longest it holds a
   down);
2. **one key per message**: a check's incident never has two keys for one kind and channel;
3. **no duplicate without a crash**: an alert (alone or in a group) arrives twice only if a
   replica crashed while sending it, and then under the Idempotency-Key of its first copy;
4. **the last word is right**: the last message of an incident that was paged is RECOVERED,
   unless it is the check's current incident and the check is still down (blindness incidents,
   one replica's each, are all over after the settling);
5. **in order**: per check and channel, each alert's first copy after every earlier one's
   (incidents in turn; DOWN, reminders, RECOVERED): no RECOVERED before its DOWN;
6. **the status API agrees**: after the settling each replica's ``collect`` and ``health`` say
   the ledger is readable, nothing is blind, the replica is healthy, and each heartbeat
   check's last beat is its own DAG's newest.

Besides the random faults, a schedule with 2-3 replicas run one after another and 3-4 checks ends
with an adversary: every check down, then back at once to a receiver taking 4 s a message, and
another replica passing inside the third send, when a lease taken with the pass's first clock
read would have run out (``overlap``; defect 3 of issue 28 is found that way).

A violation names the seed; :func:`replay` re-runs one seed. What this does not exercise (real
processes, SIGKILL and SIGSTOP, a hung PostgreSQL, a replica finding a lease that ran out under
another's feet in wall time) is what :mod:`onceflow.testing.watchdog_process_faults` generates,
checked by the same :func:`check_promises` (with its :class:`Timing`); example tests with real
processes are in ``tests/integration/test_watchdog_processes.py`` and
``test_watchdog_hung_store.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiver, read_records
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import WatchdogConfig, parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.schema import ensure_schema, heartbeats, incidents

T0 = 1_800_000_000.0
LOOP = 5.0
PERIOD = 30.0
GRACE = 30.0
BEAT_EVERY = 10.0
SEND_TIMEOUT = 2.0
BACKOFF_MAX = 20.0
LEASE = SEND_TIMEOUT + 5.0

EVENT_KINDS = (
    "silence",  # arg: list of check names whose beats stop
    "resume",  # arg: list of check names whose beats start again
    "crash_in_send",  # arg: replica index; dies after its next accepted send, before marking it
    "crash",  # arg: replica index; dies now
    "stall",  # arg: replica index; makes no pass until "unstall" (SIGSTOP)
    "unstall",
    "restart",  # arg: replica index; a new process on the same state file
    "ledger_down",  # the ledger unreadable for every replica
    "ledger_readonly",  # reads work, writes fail
    "ledger_up",
    "receiver_slow",  # arg: seconds of fake time per accepted message
    "receiver_refuse",  # 503
    "receiver_down",  # connection refused
    "receiver_up",
    "overlap",  # another replica passes inside the next send begun a lease's length into a pass
)


@dataclass(frozen=True)
class Timing:
    """The settings a schedule ran with, which the promises' time bounds are made of."""

    period: float = PERIOD
    grace: float = GRACE
    loop: float = LOOP
    backoff_max: float = BACKOFF_MAX
    lease: float = LEASE
    #: Added to the paging bound: real processes' start-up and scheduling under load, a slow
    #: receiver's queue (0 on the fake clock).
    extra: float = 0.0


class _Crash(BaseException):
    """A replica's death, raised past every ``except Exception`` (as SIGKILL would cut it)."""


@dataclass(frozen=True)
class Event:
    at: float  # seconds after T0
    kind: str
    arg: Any = None


@dataclass(frozen=True)
class Schedule:
    seed: int
    checks: tuple[str, ...]
    replicas: int
    duration: float
    events: tuple[Event, ...]
    flap_threshold: int = 0
    group_max: int = 50
    #: Replicas' passes run in threads at once (races of real replicas; the interleaving then
    #: varies between replays, the schedule does not), else one after another.
    concurrent: bool = False


def generate(seed: int, *, max_checks: int = 4, max_replicas: int = 3, duration: float = 400.0) -> Schedule:
    """A schedule that is a pure function of ``seed``."""
    rng = random.Random(seed)
    checks = tuple(f"c{i}" for i in range(rng.randint(1, max_checks)))
    replicas = rng.randint(1, max_replicas)
    events: list[Event] = []
    t = 0.0
    while True:
        t += rng.expovariate(1 / 25.0)
        if t >= duration:
            break
        kind = rng.choices(
            EVENT_KINDS[:-1],
            weights=(6, 5, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2),
        )[0]
        arg: Any = None
        if kind in ("silence", "resume"):
            arg = sorted(rng.sample(checks, rng.randint(1, len(checks))))
        elif kind in ("crash_in_send", "crash", "stall", "unstall", "restart"):
            arg = rng.randrange(replicas)
        elif kind == "receiver_slow":
            arg = rng.choice((0.5, 1.5, 4.0))  # fake seconds per message: 4 x 3 checks > a lease
        events.append(Event(round(t, 1), kind, arg))
        if kind in ("ledger_down", "ledger_readonly"):
            # A store outage lasts a while, then ends (a schedule may also end during one).
            events.append(Event(round(t + rng.uniform(10, 120), 1), "ledger_up"))
    flap_threshold, group_max, concurrent = rng.choice((0, 0, 3)), rng.choice((1, 50)), rng.random() < 0.5
    if replicas > 1 and not concurrent and len(checks) >= 3:
        # Appended after the random part (which stays the seed's as before): everything healthy,
        # every check down, then back at once to a receiver taking 4 s a message (recoveries go
        # one by one); another replica passes inside the third send, when a lease taken with the
        # pass's first clock read has run out.
        at = duration
        events += [
            Event(at, "ledger_up"),
            Event(at, "receiver_up"),
            *(Event(at, kind, r) for r in range(replicas) for kind in ("unstall", "restart")),
            Event(at, "silence", list(checks)),
            Event(at + 100, "receiver_slow", 4.0),
            Event(at + 100, "overlap"),
            Event(at + 100, "resume", list(checks)),
        ]
        duration += 130
    return Schedule(
        seed=seed,
        checks=checks,
        replicas=replicas,
        duration=duration,
        events=tuple(sorted(events, key=lambda e: e.at)),
        flap_threshold=flap_threshold,
        group_max=group_max,
        concurrent=concurrent,
    )


@dataclass
class Outcome:
    schedule: Schedule
    messages: list[dict[str, Any]]  # accepted webhooks with "t" (fake seconds after T0)
    crashed_keys: set[str]
    final: dict[str, dict[str, Any]]  # check -> its stored incident row
    silences: list[tuple[str, float, float]]  # check, last beat, silence end (fake seconds)
    unavailable: list[tuple[float, float]]  # receiver or all replicas unavailable
    ledger_out: list[tuple[float, float]]
    log: list[str] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    #: What each replica's status API said after the settling that it should not have.
    status_problems: list[str] = field(default_factory=list)


class _Run:
    def __init__(self, schedule: Schedule, workdir: Path) -> None:
        self.s = schedule
        self.dir = workdir
        self.clock = FakeClock(T0)
        self.receiver = AlertReceiver(workdir / "received.jsonl").start()
        self.port = self.receiver.port
        self.receipts: list[tuple[float, str]] = []
        self.receipt_lock = threading.Lock()
        self.flight = threading.Lock()
        self.inflight: dict[str, float] = {}  # key -> lease end, of each send not yet marked
        self.send_started: dict[str, float] = {}
        self.slow = 0.0
        self.receiver.on_accept(self._accepted)
        self.ledger_url = f"sqlite:///{workdir / 'ledger.db'}"
        self.world = sa.create_engine(self.ledger_url)
        ensure_schema(self.world)
        self.stalled: set[int] = set()
        self.crash_next: set[int] = set()
        self.overlap = False  # another replica is to pass inside a late send
        self.pass_began: dict[int, float] = {}
        self.running: set[int] = set()
        self.crashed_keys: set[str] = set()
        self.silent: dict[str, float] = {}  # check -> when its silence began (its last beat)
        self.silences: list[tuple[str, float, float]] = []
        self.last_beat: dict[str, float] = {}
        self.ledger_state = "up"
        self.ledger_out: list[tuple[float, float]] = []
        self.ledger_out_since: float | None = None
        self.unavailable: list[tuple[float, float]] = []
        self.receiver_state = "up"
        self.receiver_out_since: float | None = None
        self.beat_seq = 0
        self.log: list[str] = []
        self.status_problems: list[str] = []
        self.replicas: list[Watchdog | None] = [self._start(i) for i in range(schedule.replicas)]

    # -- parts ---------------------------------------------------------------------------

    def _accepted(self, headers: dict[str, str]) -> None:
        """The receiver takes ``slow`` fake seconds per message, counted from when its send began:
        sends running at once overlap, as they do in time (each adding its delay to the shared
        clock made two concurrent 4 s sends take 8 s, past a lease). Nor does the clock pass the
        lease of another send still between its start and its mark: in time that one's mark takes
        milliseconds, not another message's seconds. (Never by waiting for it: a handler that waits
        in real time outlasts its sender's real deadline, and the sender sends again.)"""
        key = headers.get("Idempotency-Key", "")
        if self.slow:
            with self.flight:
                target = self.send_started.get(key, self.clock.now()) + self.slow
                held = [until for k, until in self.inflight.items() if k != key]
                target = min([target, *held])
                if target > self.clock.now():
                    self.clock.set(target)
        with self.receipt_lock:
            self.receipts.append((self.clock.now() - T0, headers.get("Idempotency-Key", "")))

    def config(self, i: int) -> WatchdogConfig:
        checks = {
            c: {
                "kind": "heartbeat",
                "dag_id": c,
                "period_seconds": PERIOD,
                "grace_seconds": GRACE,
                "max_lag_seconds": 600,
                "flap_threshold": self.s.flap_threshold,
                "flap_window_seconds": 600,
            }
            for c in self.s.checks
        }
        return parse_config(
            {
                "ledger_url": self.ledger_url,
                "state_dir": str(self.dir / f"state-{i}"),
                "loop_seconds": LOOP,
                "replica": f"r{i}",
                "alerts": {
                    "webhook_url": f"http://127.0.0.1:{self.port}/webhook",
                    "send_timeout_seconds": SEND_TIMEOUT,
                    "backoff_seconds": 2,
                    "backoff_max_seconds": BACKOFF_MAX,
                    "reminder_seconds": 3600,
                    "group_max": self.s.group_max,
                },
                "checks": checks,
            }
        )

    def _start(self, i: int) -> Watchdog:
        wd = Watchdog(self.config(i), clock=self.clock.now)
        run = self

        for outbox in (wd.outbox, wd.local_outbox):
            original, original_group = outbox._send, outbox._send_group

            def send(channel: str, key: str, payload: dict[str, Any], _orig: Any = original) -> None:
                run._overlap(i, key)
                run.send_started[key] = run.clock.now()
                _orig(channel, key, payload)
                if i in run.crash_next:
                    run.crash_next.discard(i)
                    ids = payload["onceflow"].get("alert_ids") or [key]
                    run.crashed_keys.update([key, *ids])
                    raise _Crash(f"r{i} killed after {key} was accepted")

            def send_group(
                engine: Any, group: list[dict[str, Any]], key: str, *rest: Any, _orig: Any = original_group
            ) -> bool:
                with run.flight:  # from the lease renewed as the send starts to its mark
                    run.inflight[key] = group[0]["lease_until"]
                try:
                    return bool(_orig(engine, group, key, *rest))
                finally:
                    with run.flight:
                        run.inflight.pop(key, None)

            outbox._send = send  # type: ignore[method-assign]
            outbox._send_group = send_group  # type: ignore[method-assign,assignment]
        self._apply_ledger(wd)
        return wd

    def _apply_ledger(self, wd: Watchdog) -> None:
        if self.ledger_state == "up":
            wd._ledger = None
            wd._schema_ready = False
        elif self.ledger_state == "down":
            wd._ledger = sa.create_engine(f"sqlite:///{self.dir / 'gone' / 'ledger.db'}")
            wd._schema_ready = True
        else:  # read-only: every connection refuses writes
            engine = sa.create_engine(self.ledger_url)

            @sa.event.listens_for(engine, "connect")
            def _ro(dbapi_connection: Any, _record: Any) -> None:
                dbapi_connection.execute("PRAGMA query_only = ON")

            wd._ledger = engine
            wd._schema_ready = True

    def _beat(self, check: str, now: float) -> None:
        self.beat_seq += 1
        with self.world.begin() as conn:
            conn.execute(
                heartbeats.insert().values(
                    run_id=f"{check}-{self.beat_seq}",
                    dag_id=check,
                    scheduled_at=now,
                    started_at=now,
                    lag_seconds=0.0,
                    try_number=1,
                )
            )
        self.last_beat[check] = now - T0

    # -- events --------------------------------------------------------------------------

    def apply(self, e: Event) -> None:
        t = e.at
        self.log.append(f"t={t:.1f} {e.kind} {e.arg if e.arg is not None else ''}")
        if e.kind == "silence":
            for c in e.arg:
                self.silent.setdefault(c, self.last_beat.get(c, 0.0))
        elif e.kind == "resume":
            for c in e.arg:
                if c in self.silent:
                    self.silences.append((c, self.silent.pop(c), t))
        elif e.kind == "crash_in_send":
            if self.replicas[e.arg] is not None:
                self.crash_next.add(e.arg)
        elif e.kind == "crash":
            self.replicas[e.arg] = None
        elif e.kind == "stall":
            self.stalled.add(e.arg)
        elif e.kind == "unstall":
            self.stalled.discard(e.arg)
        elif e.kind == "restart":
            self.stalled.discard(e.arg)
            self.replicas[e.arg] = self._start(e.arg)
        elif e.kind in ("ledger_down", "ledger_readonly", "ledger_up"):
            new = {"ledger_down": "down", "ledger_readonly": "readonly", "ledger_up": "up"}[e.kind]
            if new != "up" and self.ledger_out_since is None:
                self.ledger_out_since = t
            if new == "up" and self.ledger_out_since is not None:
                self.ledger_out.append((self.ledger_out_since, t))
                self.ledger_out_since = None
            self.ledger_state = new
            for wd in self.replicas:
                if wd is not None:
                    self._apply_ledger(wd)
        elif e.kind == "receiver_slow":
            self.slow = e.arg
        elif e.kind == "overlap":
            self.overlap = True
        elif e.kind in ("receiver_refuse", "receiver_down", "receiver_up"):
            self._set_receiver(e.kind.removeprefix("receiver_"), t)

    def _set_receiver(self, state: str, t: float) -> None:
        if state == self.receiver_state:
            return
        if self.receiver_state == "down":
            self.receiver = AlertReceiver(self.dir / "received.jsonl", port=self.port).start()
            self.receiver.on_accept(self._accepted)
        if state == "down":
            self.receiver.stop()
        else:
            self.receiver.set_down(state == "refuse")
        if state == "up":
            self.slow = 0.0
        if state != "up" and self.receiver_out_since is None:
            self.receiver_out_since = t
        if state == "up" and self.receiver_out_since is not None:
            self.unavailable.append((self.receiver_out_since, t))
            self.receiver_out_since = None
        self.receiver_state = state

    # -- the run -------------------------------------------------------------------------

    def step(self) -> None:
        now = self.clock.now()
        for c in self.s.checks:
            if c not in self.silent and now - T0 - self.last_beat.get(c, -1e9) >= BEAT_EVERY:
                self._beat(c, now)
        live = [i for i, wd in enumerate(self.replicas) if wd is not None and i not in self.stalled]
        if self.s.concurrent and len(live) > 1:
            threads = [threading.Thread(target=self._pass, args=(i,)) for i in live]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for i in live:
                self._pass(i)

    def _pass(self, i: int) -> None:
        wd = self.replicas[i]
        if wd is None:
            return
        self.pass_began[i] = self.clock.now()
        self.running.add(i)
        try:
            wd.run_once()
        except _Crash as crash:
            self.log.append(f"t={self.clock.now() - T0:.1f} {crash}")
            self.replicas[i] = None
        finally:
            self.running.discard(i)

    def _overlap(self, i: int, key: str) -> None:
        """Replica ``i`` starts sending ``key``: if an ``overlap`` is due and a lease's length has
        passed since its pass began, another replica passes now, inside the send (a lease taken
        with the pass's first clock read has run out; the one taken as the send starts holds)."""
        if self.clock.now() - self.pass_began.get(i, float("inf")) < LEASE:
            return
        with self.receipt_lock:
            others = [j for j, wd in enumerate(self.replicas) if wd is not None and j != i]
            ready = [j for j in others if j not in self.running and j not in self.stalled]
            if not (self.overlap and ready):
                return
            self.overlap = False
        self.log.append(f"t={self.clock.now() - T0:.1f} r{ready[0]} passes inside r{i}'s send of {key}")
        self._pass(ready[0])

    def run(self) -> Outcome:
        import logging

        # Thousands of passes: their log lines (each failed delivery, each transition) cost more
        # than the passes. The promises are checked on what the receiver got, not on logs.
        quiet = logging.getLogger("onceflow.watchdog")
        level, quiet.level = quiet.level, logging.CRITICAL + 1
        try:
            return self._run()
        finally:
            quiet.setLevel(level)

    def _run(self) -> Outcome:
        events = list(self.s.events)
        nobody_since: float | None = None
        try:
            while self.clock.now() - T0 < self.s.duration:
                t = self.clock.now() - T0
                while events and events[0].at <= t:
                    self.apply(events.pop(0))
                alive = any(wd is not None and i not in self.stalled for i, wd in enumerate(self.replicas))
                if not alive and nobody_since is None:
                    nobody_since = t
                if alive and nobody_since is not None:
                    self.unavailable.append((nobody_since, t))
                    nobody_since = None
                self.step()
                self.clock.set(max(self.clock.now(), T0 + t + LOOP))
            end = self.clock.now() - T0
            if nobody_since is not None:
                self.unavailable.append((nobody_since, end))
            self.settle(end)
            self.status_problems = self.check_status()
        finally:
            self.receiver.stop()
            self.world.dispose()
        return self.outcome()

    def check_status(self) -> list[str]:
        """Each replica's status API after the settling: every source readable, nothing blind,
        healthy, and each heartbeat check's last beat its own DAG's newest."""
        from onceflow.watchdog.status import collect, health

        with self.world.connect() as conn:
            newest = dict(
                conn.execute(
                    sa.select(heartbeats.c.dag_id, sa.func.max(heartbeats.c.started_at)).group_by(
                        heartbeats.c.dag_id
                    )
                ).all()
            )
        return [
            f"r{i} {problem}"
            for i, wd in enumerate(self.replicas)
            if wd is not None
            for problem in status_problems(collect(wd), health(wd), newest)
        ]

    def settle(self, end: float) -> None:
        """Everything healthy, every replica back: the outbox drains, the checks end judged."""
        self.log.append(f"t={end:.1f} settle")
        if self.ledger_out_since is not None:
            self.ledger_out.append((self.ledger_out_since, end))
            self.ledger_out_since = None
        self.ledger_state = "up"
        self._set_receiver("up", end)
        self.crash_next.clear()
        self.overlap = False
        self.stalled.clear()
        for i, wd in enumerate(self.replicas):
            if wd is None:
                self.replicas[i] = self._start(i)
            else:
                self._apply_ledger(wd)
        for c in list(self.silent):
            self.silences.append((c, self.silent[c], float("inf")))  # still silent at the end
        for _ in range(int((BACKOFF_MAX + LEASE + 2 * LOOP) / LOOP) + 4):
            self.step()
            self.clock.advance(LOOP)

    def outcome(self) -> Outcome:
        when: dict[str, list[float]] = {}
        for t, key in self.receipts:
            when.setdefault(key, []).append(t)
        messages = []
        seen: dict[str, int] = {}
        for r in read_records(self.dir / "received.jsonl"):
            if r["kind"] != "webhook" or r.get("refused"):
                continue
            key = r["idempotency_key"]
            n = seen.get(key, 0)
            seen[key] = n + 1
            times = when.get(key, [])
            messages.append(
                {"key": key, "t": times[n] if n < len(times) else None, **r["message"]["onceflow"]}
            )
        engine = sa.create_engine(self.ledger_url)
        with engine.connect() as conn:
            final = {r.check_name: dict(r._mapping) for r in conn.execute(sa.select(incidents))}
        engine.dispose()
        return Outcome(
            self.s,
            messages,
            self.crashed_keys,
            final,
            self.silences,
            self.unavailable,
            self.ledger_out,
            self.log,
            status_problems=self.status_problems,
        )


def status_problems(
    report: dict[str, Any],
    health: tuple[bool, str],
    newest_beat: dict[str, float],
    newest_after: dict[str, float] | None = None,
) -> list[str]:
    """What a settled replica's status (``collect``) and ``/health`` must not say: everything is
    readable and no pass is stuck, so nothing is blind; a check's last beat is its DAG's newest
    (read before the report, or between that and ``newest_after`` while beats go on)."""
    after = newest_after or newest_beat
    out = []
    if not report["ledger"]["readable"]:
        out.append(f"status: ledger unreadable after the settling: {report['ledger']['error']}")
    if report["blind"]:
        out.append(f"status: still blind after the settling: {sorted(report['blind'])}")
    if not health[0]:
        out.append(f"/health: {health[1]}")
    for name, entry in report["checks"].items():
        if "last_beat" not in entry:
            continue
        beat, low, high = entry["last_beat"], newest_beat.get(name), after.get(name)
        if beat != low and (beat is None or low is None or high is None or not low <= beat <= high):
            out.append(f"status: {name}'s last beat {beat} is not its DAG's newest {low}")
    return out


def run_schedule(schedule: Schedule, workdir: Path) -> Outcome:
    """Run ``schedule`` in ``workdir`` (fresh files); return what happened."""
    workdir.mkdir(parents=True, exist_ok=True)
    return _Run(schedule, workdir).run()


def _members(m: dict[str, Any]) -> list[dict[str, Any]]:
    """A message as the alerts it carries (a group carries several), each with its own ``key`` (its
    row's key) and the ``message_key`` (the Idempotency-Key) it came under."""
    if m.get("kind") == "group":
        return [
            {**a, "key": a["alert_id"], "message_key": m["key"], "t": m["t"], "took": m.get("took")}
            for a in m["alerts"]
        ]
    return [{**m, "message_key": m["key"]}]


def copies_by_alert(messages: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each alert (a row's key) and every copy of it received, alone or in a group, in order."""
    copies: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        for a in _members(m):
            copies.setdefault(a["key"], []).append(a)
    return copies


def _incident_of(a: dict[str, Any]) -> str:
    # A blindness incident is one replica's: its key carries the state file's id (``<id>.<n>``).
    return a["key"].split("/")[1] if a["check"].startswith("watchdog.blind.") else str(a["incident"])


#: Within one check and channel, the order the outbox queues an incident's messages in.
_RANK = {"down": 0, "flapping": 0, "reminder": 1, "recovery": 2}


def check_promises(o: Outcome) -> list[str]:
    """The violated promises (empty: all held); see the module docstring."""
    out: list[str] = []
    alerts = [a for m in o.messages for a in _members(m)]
    # 3. an alert (alone or in a group) twice only if a crash interrupted its send, and then under
    # the same Idempotency-Key: a receiver that drops repeated keys must be able to drop it.
    copies = copies_by_alert(o.messages)
    for key, cs in copies.items():
        if len(cs) < 2:
            continue
        if key not in o.crashed_keys and not any(c["message_key"] in o.crashed_keys for c in cs):
            out.append(f"key {key} received {len(cs)} times without a crash while sending it")
        under = sorted({c["message_key"] for c in cs})
        if len(under) > 1:
            out.append(f"alert {key} came again under another Idempotency-Key: {under}")
    # 2. one key per (check, incident, kind, channel)
    keys: dict[tuple[str, str, str], set[str]] = {}
    for a in alerts:
        if a["kind"] == "reminder":
            continue
        keys.setdefault((a["check"], _incident_of(a), a["kind"]), set()).add(a["key"])
    for (check, incident, kind), ks in keys.items():
        if len(ks) > 1:
            out.append(f"{check} incident {incident}: {len(ks)} keys for one {kind}: {sorted(ks)}")
    # 5. in order: per check and channel, each alert's first copy after every earlier one
    # (incidents in turn; DOWN, then reminders, then RECOVERED); repeats are judged by 3.
    seen: set[str] = set()
    latest: dict[tuple[str, str], tuple[int, int, str]] = {}
    for a in alerts:
        if a["key"] in seen or a["kind"] not in _RANK:
            continue
        seen.add(a["key"])
        scope, _, n = _incident_of(a).rpartition(".")
        lane = (f"{a['check']}/{scope}", a["key"].rsplit("/", 1)[-1])
        rank = (int(n), _RANK[a["kind"]], a["key"])
        if lane in latest and rank[:2] < latest[lane][:2]:
            out.append(f"{a['check']}: {a['key']} arrived after {latest[lane][2]}")
        latest[lane] = max(latest.get(lane, rank), rank)
    # 4 and 5. the last word and RECOVERED before DOWN, per paged incident (a blindness incident
    # is one replica's; every source is readable again after the settling, so each is over)
    by_incident: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for a in alerts:
        by_incident.setdefault((a["check"], _incident_of(a)), []).append(a)
    for (check, incident), items in by_incident.items():
        kinds = [a["kind"] for a in items]
        if "recovery" in kinds and "down" in kinds and kinds.index("recovery") < kinds.index("down"):
            out.append(f"{check} incident {incident}: RECOVERED before DOWN: {kinds}")
        final = o.final.get(check)
        current = final is not None and str(final["incident"]) == incident and final["state"] == "down"
        paged = any(k in ("down", "reminder") for k in kinds)
        if paged and not current and kinds[-1] != "recovery":
            out.append(f"{check} incident {incident} is over but its last message is {kinds[-1]}: {kinds}")
        if current and kinds[-1] == "recovery":
            out.append(f"{check} incident {incident} is down but its last message is RECOVERED")
    out += o.status_problems
    # 1. every long enough silence paged in time
    tm = o.timing
    slack = 2 * tm.loop + tm.backoff_max + tm.lease + tm.extra
    if o.schedule.flap_threshold > 0:
        slack += tm.period + tm.grace  # flap damping holds a down at most that long
    for check, last, end in o.silences:
        due = last + tm.period + tm.grace
        waited = sum(max(0.0, min(b, end) - max(a, last)) for a, b in o.unavailable)
        deadline = due + slack + waited
        if end < deadline:
            continue  # resumed before it had to be paged
        if _paged(o, alerts, check, last, deadline):
            continue
        out.append(
            f"{check} silent from t={last:.0f} to {end:.0f}: no page by t={deadline:.0f} (due {due:.0f})"
        )
    return out


def _paged(o: Outcome, alerts: list[dict[str, Any]], check: str, last: float, deadline: float) -> bool:
    for a in alerts:
        t = a.get("t")
        if t is None or t > deadline:
            continue
        if a["check"] == check and a["kind"] in ("down", "reminder", "flapping") and t >= last:
            return True
    # A check still down (paged) from an earlier silence needs no new page.
    for a in alerts:
        if a["check"] == check and a["kind"] == "down" and a.get("t") is not None and a["t"] < last:
            later = [
                b
                for b in alerts
                if b["check"] == check and b["incident"] == a["incident"] and b["kind"] == "recovery"
            ]
            if not later or all((b.get("t") or 0) > last + o.timing.period + o.timing.grace for b in later):
                return True
    # Blind while the ledger was out: the blindness page stands in for the check's.
    blind_paged = any(
        a["check"].startswith("watchdog.blind.") and a["kind"] == "down" and (a.get("t") or 1e18) <= deadline
        for a in alerts
    )
    return blind_paged and any(a0 <= deadline and b0 >= last for a0, b0 in o.ledger_out)


def replay(seed: int, workdir: Path, **generate_kwargs: Any) -> Outcome:
    """Generate, run and check one seed; raise ``AssertionError`` naming the seed on a violation."""
    schedule = generate(seed, **generate_kwargs)
    outcome = run_schedule(schedule, workdir)
    problems = check_promises(outcome)
    if problems:
        raise AssertionError(
            f"watchdog fault schedule seed={seed} broke {len(problems)} promise(s) "
            f"(replay: onceflow.testing.watchdog_faults.replay({seed}, tmp_path)):\n  "
            + "\n  ".join(problems)
            + "\nschedule:\n  "
            + "\n  ".join(outcome.log[-80:])
        )
    return outcome


def _replay_reporting(seed: int, workdir: Path) -> str | None:
    try:
        replay(seed, workdir)
    except AssertionError as exc:
        return str(exc)
    return None


def replay_many(
    seeds: Iterable[int], root: Path, *, workers: int | None = None, stop_after: int = 3
) -> list[str]:
    """Replay ``seeds`` (each in ``root/s<seed>``) on ``workers`` processes; return the failures.

    A schedule is CPU-bound (SQLite and SQLAlchemy on a fake clock), so the processes are what
    makes 100 of them fit ``make test`` on two cores. Forked, so each inherits the test process's
    network guard. Stops early once ``stop_after`` seeds failed.
    """
    seeds = list(seeds)
    workers = workers or min(len(seeds), os.cpu_count() or 1) or 1
    failures: list[str] = []
    if workers == 1:
        for seed in seeds:
            problem = _replay_reporting(seed, root / f"s{seed}")
            if problem:
                failures.append(problem)
                if len(failures) >= stop_after:
                    break
        return failures
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_replay_reporting, seed, root / f"s{seed}") for seed in seeds]
        for future in futures:
            problem = future.result()
            if problem:
                failures.append(problem)
                if len(failures) >= stop_after:
                    for rest in futures:
                        rest.cancel()
                    break
    return failures


__all__ = [
    "Event",
    "Outcome",
    "Schedule",
    "Timing",
    "check_promises",
    "generate",
    "replay",
    "replay_many",
    "run_schedule",
]
