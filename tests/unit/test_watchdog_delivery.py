"""Delivery promises of the watchdog's outbox, under a fake clock and a real local receiver.

Per incident and channel: messages arrive in order (a recovery never overtakes its down alert),
at most once without a crash (a lease is taken per row when its send starts and "mark sent"
needs it), and Idempotency-Keys never repeat across replicas, restarts or wiped state files.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.testing.alert_receiver import AlertReceiver, read_records
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

T0 = 1_800_000_000.0


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiver]:
    r = AlertReceiver(tmp_path / "received.jsonl").start()
    yield r
    r.stop()


def config(
    tmp_path: Path, receiver: AlertReceiver, replica: str, checks: dict[str, Any], **alerts: Any
) -> Any:
    return parse_config(
        {
            "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
            "state_dir": str(tmp_path / f"state-{replica}"),
            "loop_seconds": 5,
            "replica": replica,
            "alerts": {"webhook_url": receiver.webhook_url, "backoff_seconds": 30, **alerts},
            "checks": checks,
        }
    )


def beat(tmp_path: Path, run_id: str, at: float, dag_id: str = "heartbeat") -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id=run_id,
                dag_id=dag_id,
                scheduled_at=at,
                started_at=at,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()


def webhooks(receiver: AlertReceiver) -> list[dict[str, Any]]:
    return [r for r in read_records(receiver.store) if r["kind"] == "webhook" and not r.get("refused")]


HEARTBEAT = {"heartbeat": {"period_seconds": 60, "grace_seconds": 60, "max_lag_seconds": 30}}


def test_a_recovery_never_overtakes_its_down_alert_waiting_out_a_backoff(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0)
    wd = Watchdog(config(tmp_path, receiver, "a", HEARTBEAT), clock=clock.now)
    wd.run_once()
    receiver.set_down(True)
    clock.set(T0 + 125)
    assert wd.run_once().states == {"heartbeat": "down"}  # the down alert is refused: 30 s backoff
    receiver.set_down(False)
    beat(tmp_path, "r2", T0 + 126)
    clock.set(T0 + 127)
    wd.run_once()  # the check is up again while its down alert waits out the backoff
    for i in range(6):
        clock.advance(30)
        beat(tmp_path, f"r{3 + i}", clock.now())
        wd.run_once()
    got = [(w["message"]["onceflow"]["kind"], w["message"]["onceflow"]["state"]) for w in webhooks(receiver)]
    # Either down then recovery, or one message saying it was down and is up: never DOWN last.
    assert got in ([("down", "down"), ("recovery", "up")], [("recovery", "up")]), got
    assert got[-1] == ("recovery", "up")
    if len(got) == 1:
        assert "was down" in webhooks(receiver)[0]["message"]["text"]


def test_a_slow_receiver_and_a_second_replica_never_send_a_key_twice(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """24 checks down at once, each of the first replica's sends taking 0.9 s (of the shared fake
    clock); a second replica starts delivering 9 s into the first one's burst. No crash, so no key
    may arrive twice.

    Only the first replica's sends move the clock, and never while one of the second's is in
    flight: a real send ends within its 2 s deadline, well inside its 7 s lease, so no send may
    see more than one 0.9 s step pass. (When every POST moved the clock, a send of the first
    replica held up behind the second's saw its lease run out under load; then, with only the
    first replica's sends moving it, a send of the second held up under CI's load saw the first
    replica's next eight sends, 7.2 s. Both times the clock model, not the outbox, sent a key
    twice: the log showed the second send taking over a lease the first send still held.)"""
    clock = FakeClock(T0)
    checks = {
        f"c{i:02d}": {"kind": "heartbeat", "period_seconds": 60, "grace_seconds": 60} for i in range(24)
    }
    beat(tmp_path, "r1", T0)
    a = Watchdog(
        config(tmp_path, receiver, "a", checks, send_timeout_seconds=2, group_max=1), clock=clock.now
    )
    b = Watchdog(
        config(tmp_path, receiver, "b", checks, send_timeout_seconds=2, group_max=1), clock=clock.now
    )
    a.run_once()
    clock.set(T0 + 125)
    started = threading.Event()
    b_done = threading.Event()
    b_in_flight = threading.Lock()  # held while one of b's sends is out

    def slow(outbox: Any) -> None:
        send = outbox._send

        def sending(channel: str, key: str, payload: dict[str, Any]) -> None:
            send(channel, key, payload)
            with b_in_flight:
                clock.advance(0.9)
            if clock.now() >= T0 + 125 + 9 and not started.is_set():
                started.set()
                threading.Thread(target=lambda: (b.run_once(), b_done.set()), daemon=True).start()

        outbox._send = sending

    def in_flight(outbox: Any) -> None:
        send = outbox._send

        def sending(channel: str, key: str, payload: dict[str, Any]) -> None:
            with b_in_flight:
                send(channel, key, payload)

        outbox._send = sending

    slow(a.outbox)
    slow(a.local_outbox)
    in_flight(b.outbox)
    in_flight(b.local_outbox)
    a.run_once()
    assert started.is_set()
    assert b_done.wait(120)
    keys = [w["idempotency_key"] for w in webhooks(receiver)]
    assert len(keys) == 24, keys
    assert len(set(keys)) == len(keys), sorted(keys)


def test_blindness_alerts_never_reuse_an_idempotency_key(tmp_path: Path, receiver: AlertReceiver) -> None:
    """Three outages: replicas a and b, then a again after its state directory was wiped."""
    clock = FakeClock(T0)
    bad = {"ledger_url": f"sqlite:///{tmp_path / 'missing' / 'ledger.db'}"}
    keys: list[str] = []
    for replica, wipe in (("a", False), ("b", False), ("a", True)):
        if wipe:
            shutil.rmtree(tmp_path / f"state-{replica}")
        cfg = dataclasses.replace(config(tmp_path, receiver, replica, HEARTBEAT), **bad)
        wd = Watchdog(cfg, clock=clock.now)
        for _ in range(4):
            wd.run_once()
            clock.advance(6)
        keys = [w["idempotency_key"] for w in webhooks(receiver)]
    down = [k for k in keys if "/down/" in k]
    assert len(down) == 3, keys
    assert len(set(down)) == 3, down


class _Killed(BaseException):
    """A replica's death after the receiver accepted (past every ``except Exception``)."""


def _kill_after_send(wd: Watchdog) -> None:
    real = wd.outbox._send

    def send(channel: str, key: str, payload: dict[str, Any]) -> None:
        real(channel, key, payload)
        raise _Killed(key)

    wd.outbox._send = send  # type: ignore[method-assign]


def test_a_group_resent_after_a_crash_keeps_its_idempotency_key(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """Replica a sends a and b down as one group, the receiver accepts, a dies before marking it.
    When b resends it, c has just gone down. The group goes again as it was, under its key (a
    receiver that drops repeated keys drops it), and c alone. It used to be regrouped as a+b+c
    under a new key, which no receiver can tell from a new message."""
    clock = FakeClock(T0)
    checks = {
        n: {"kind": "heartbeat", "dag_id": dag, "period_seconds": 60, "grace_seconds": 60}
        for n, dag in (("a", "heartbeat"), ("b", "heartbeat"), ("c", "c"))
    }
    beat(tmp_path, "r1", T0)
    beat(tmp_path, "c1", T0 + 16, dag_id="c")  # c goes down at T0 + 136
    a = Watchdog(config(tmp_path, receiver, "a", {n: checks[n] for n in "ab"}), clock=clock.now)
    a.run_once()
    clock.set(T0 + 125)
    _kill_after_send(a)
    with pytest.raises(_Killed):
        a.run_once()
    b = Watchdog(config(tmp_path, receiver, "b", checks), clock=clock.now)
    clock.set(T0 + 136)  # a's lease (send timeout 5 s + 5 s) has run out
    b.run_once()
    got = [(w["idempotency_key"], w["message"]["onceflow"].get("alert_ids")) for w in webhooks(receiver)]
    group = ["a/1/down/webhook", "b/1/down/webhook"]
    assert got == [
        ("a/1/down/webhook+1", group),  # a's send, accepted before a died
        ("a/1/down/webhook+1", group),  # the repeat of the crash window, under the same key
        ("c/1/down/webhook", None),
    ], got


def test_a_group_leased_slowly_is_not_sent_again_by_another_replica(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """12 checks down at once, one group; the store takes a second per lease, so leasing the
    group takes longer than a lease lasts (send timeout 2 + 5 s). A second replica passing while
    the group's message is on its way must find the leases held: they are renewed as the send
    starts. They used to end 7 s after the first clock read, and the second replica resent them."""
    clock = FakeClock(T0)
    checks = {
        f"c{i:02d}": {"kind": "heartbeat", "period_seconds": 60, "grace_seconds": 60} for i in range(12)
    }
    beat(tmp_path, "r1", T0)
    a = Watchdog(config(tmp_path, receiver, "a", checks, send_timeout_seconds=2), clock=clock.now)
    b = Watchdog(config(tmp_path, receiver, "b", checks, send_timeout_seconds=2), clock=clock.now)
    a.run_once()
    lease = a.outbox._lease

    def slow_lease(*args: Any) -> Any:
        clock.advance(1.0)  # a store answering each statement in a second
        return lease(*args)

    a.outbox._lease = slow_lease  # type: ignore[method-assign,assignment]
    passes: list[Any] = []

    def second_replica_passes(_headers: dict[str, str]) -> None:
        if not passes:  # a's message, on its way: b passes (its own send, if any, comes here too)
            passes.append(b.run_once())

    receiver.on_accept(second_replica_passes)
    clock.set(T0 + 125)
    a.run_once()
    receiver.on_accept(None)
    assert passes, "the second replica never passed during the send"
    ids = [
        i
        for w in webhooks(receiver)
        for i in w["message"]["onceflow"].get("alert_ids", [w["idempotency_key"]])
    ]
    assert sorted(ids) == sorted(f"c{i:02d}/1/down/webhook" for i in range(12)), ids


def test_a_hung_receiver_costs_a_pass_one_send_deadline_not_one_per_alert(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """A webhook that accepts connections and never answers, five alerts queued, no grouping:
    after the first send runs out its deadline, the rest wait for the next pass. Five deadlines in
    a row used to hold the pass (with 2 x loop + 30 s of budget and 5 s deadlines, 13 alerts make
    it a blind pass, and the process re-executes itself every three budgets)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    clock = FakeClock(T0)
    checks = {f"c{i}": {"kind": "heartbeat", "period_seconds": 60, "grace_seconds": 60} for i in range(5)}
    beat(tmp_path, "r1", T0)
    cfg = config(tmp_path, receiver, "a", checks, send_timeout_seconds=0.3, group_max=1)
    hung = f"http://127.0.0.1:{listener.getsockname()[1]}/webhook"
    wd = Watchdog(
        dataclasses.replace(cfg, alerts=dataclasses.replace(cfg.alerts, webhook_url=hung)), clock=clock.now
    )
    try:
        wd.run_once()
        clock.set(T0 + 125)
        assert wd.run_once().states == dict.fromkeys(checks, "down")
        assert len(held) == 1
        clock.advance(5)
        wd.run_once()  # the next pass tries the next alert (the first waits out its backoff)
        assert len(held) == 2
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_a_send_whose_lease_was_taken_over_logs_who_holds_it_now(
    tmp_path: Path, receiver: AlertReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """The receiver accepted, but another replica leased the row meanwhile: the error names the
    row's holder and lease against this send's, which is what a post-mortem of a double send needs."""
    import sqlalchemy as sa

    from onceflow.watchdog.schema import alerts

    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0)
    a = Watchdog(config(tmp_path, receiver, "a", HEARTBEAT), clock=clock.now)
    a.run_once()
    clock.set(T0 + 125)
    send = a.outbox._send

    def taken_over_while_sending(channel: str, key: str, payload: dict[str, Any]) -> None:
        send(channel, key, payload)
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        with engine.begin() as conn:
            conn.execute(alerts.update().values(lease_owner="b#other", lease_until=T0 + 999))
        engine.dispose()

    a.outbox._send = taken_over_while_sending  # type: ignore[method-assign]
    with caplog.at_level("ERROR", logger="onceflow.watchdog.alerts"):
        a.run_once()
    [message] = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert "heartbeat/1/down/webhook" in message and "'b#other'" in message and str(T0 + 999) in message
    assert f"the send ended at {T0 + 125}" in message
