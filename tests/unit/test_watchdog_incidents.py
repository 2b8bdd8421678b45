"""The watchdog's incidents under a controlled clock: up -> late -> down -> up, alerts exactly once.

The ledger and warehouse are SQLite files; alerts go to the local receiver (a real HTTP server
in a thread). Results are read back by plain SQL and from the receiver's store file.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiver, read_records
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import EXIT_FAILING, EXIT_OK, Watchdog
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


def make_config(
    tmp_path: Path, receiver: AlertReceiver, state: str = "state", **checks: dict[str, Any]
) -> Any:
    raw: dict[str, Any] = {
        "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
        "warehouse_url": f"sqlite:///{tmp_path / 'warehouse.db'}",
        "state_dir": str(tmp_path / state),
        "loop_seconds": 5,
        "replica": state,
        "alerts": {"webhook_url": receiver.webhook_url, "reminder_seconds": 600, "backoff_seconds": 1},
        "checks": checks
        or {"heartbeat": {"period_seconds": 60, "grace_seconds": 120, "max_lag_seconds": 30}},
    }
    return parse_config(raw)


def beat(tmp_path: Path, run_id: str, scheduled: float, started: float) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id=run_id,
                dag_id="heartbeat",
                scheduled_at=scheduled,
                started_at=started,
                lag_seconds=started - scheduled,
                try_number=1,
            )
        )
    engine.dispose()


def alert_rows(tmp_path: Path) -> list[dict[str, Any]]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT dedup_key, kind, state, attempts, created_at FROM watchdog_alerts ORDER BY id")
        )
        out = [dict(r._mapping) for r in rows]
    engine.dispose()
    return out


def incident_row(tmp_path: Path, check: str) -> dict[str, Any]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT * FROM watchdog_incidents WHERE check_name = :c"), {"c": check}
        ).one()
    engine.dispose()
    return dict(row._mapping)


def received(receiver: AlertReceiver) -> list[tuple[str, str, int]]:
    return [
        (
            r["message"]["onceflow"]["check"],
            r["message"]["onceflow"]["kind"],
            r["message"]["onceflow"]["incident"],
        )
        for r in read_records(receiver.store)
        if r["kind"] == "webhook" and not r.get("refused")
    ]


def test_it_goes_late_then_down_alerts_once_reminds_and_recovers(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0 - 2, T0)
    wd = Watchdog(make_config(tmp_path, receiver), clock=clock.now)
    assert wd.run_once().states == {"heartbeat": "up"}

    clock.set(T0 + 61)
    assert wd.run_once().states == {"heartbeat": "late"}
    assert received(receiver) == []

    clock.set(T0 + 60 + 120 + 1)
    result = wd.run_once()
    assert result.states == {"heartbeat": "down"} and result.exit_code == EXIT_FAILING
    for _ in range(5):  # more passes inside the reminder interval send nothing more
        clock.advance(60)
        wd.run_once()
    assert received(receiver) == [("heartbeat", "down", 1)]
    [down] = [m for m in receiver.webhooks()]
    assert "no heartbeat for" in down["text"] and "docs/watchdog.md#check-heartbeat" in down["text"]
    assert down["onceflow"]["evidence"]["last_beat_run_id"] == "r1"

    clock.advance(300)  # 600 s after the down alert
    wd.run_once()
    assert received(receiver) == [("heartbeat", "down", 1), ("heartbeat", "reminder", 1)]

    beat(tmp_path, "r2", clock.now() - 1, clock.now())
    assert wd.run_once().exit_code == EXIT_OK
    assert received(receiver)[-1] == ("heartbeat", "recovery", 1)
    assert [r["state"] for r in alert_rows(tmp_path)] == ["sent", "sent", "sent"]


def test_a_slow_scheduler_shows_as_late_before_it_is_dead(tmp_path: Path, receiver: AlertReceiver) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "slow", T0 - 45, T0)  # started 45 s after it was due; max lag 30 s
    wd = Watchdog(make_config(tmp_path, receiver), clock=clock.now)
    assert wd.run_once().states == {"heartbeat": "late"}
    assert "scheduler slow" in incident_row(tmp_path, "heartbeat")["reason"]


def test_a_watchdog_started_after_the_beats_stopped_judges_from_the_last_beat(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """Its own start time is irrelevant: the beat 10 minutes ago is overdue at the first pass."""
    clock = FakeClock(T0 + 600)
    beat(tmp_path, "r1", T0 - 1, T0)
    wd = Watchdog(make_config(tmp_path, receiver), clock=clock.now)
    assert wd.run_once().states == {"heartbeat": "down"}
    assert incident_row(tmp_path, "heartbeat")["since"] == T0 + 60 + 120
    assert received(receiver) == [("heartbeat", "down", 1)]


def test_two_replicas_and_a_restart_alert_once_per_incident(tmp_path: Path, receiver: AlertReceiver) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0, T0)
    a = Watchdog(make_config(tmp_path, receiver, state="a"), clock=clock.now)
    b = Watchdog(make_config(tmp_path, receiver, state="b"), clock=clock.now)
    clock.set(T0 + 200)
    a.run_once()
    b.run_once()
    restarted = Watchdog(make_config(tmp_path, receiver, state="a"), clock=clock.now)
    restarted.run_once()
    assert received(receiver) == [("heartbeat", "down", 1)]
    assert incident_row(tmp_path, "heartbeat")["incident"] == 1


def test_a_silence_holds_the_alert_until_it_ends(tmp_path: Path, receiver: AlertReceiver) -> None:
    start = dt.datetime.fromtimestamp(T0, dt.timezone.utc)
    silence = {"start": start, "end": start + dt.timedelta(minutes=30), "reason": "db upgrade"}
    hb = {"period_seconds": 60, "grace_seconds": 120, "silences": [silence]}
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0, T0)
    wd = Watchdog(make_config(tmp_path, receiver, heartbeat=hb), clock=clock.now)
    clock.set(T0 + 600)
    assert wd.run_once().states == {"heartbeat": "down"}
    assert received(receiver) == []
    clock.set(T0 + 1800 + 5)
    wd.run_once()
    wd.run_once()
    assert received(receiver) == [("heartbeat", "down", 1)]


def test_an_unreachable_receiver_gets_the_alert_once_when_it_is_back(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0, T0)
    wd = Watchdog(make_config(tmp_path, receiver), clock=clock.now)
    receiver.set_down(True)
    clock.set(T0 + 200)
    wd.run_once()
    for _ in range(4):
        clock.advance(10)
        wd.run_once()
    assert received(receiver) == []
    refused = [r for r in read_records(receiver.store) if r.get("refused")]
    assert len(refused) >= 2  # retried with backoff (1, 2, 4 s ...), each refused
    receiver.set_down(False)
    clock.advance(60)
    wd.run_once()
    clock.advance(60)
    wd.run_once()
    assert received(receiver) == [("heartbeat", "down", 1)]
    [row] = alert_rows(tmp_path)
    assert row["state"] == "sent" and row["attempts"] == len(refused) + 1


# -- 60 hours of nothing --------------------------------------------------------------------

AMS = "Europe/Amsterdam"


def _utc(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def _load_audit(tmp_path: Path, partitions: list[str], table: str = "daily_sales") -> None:
    from onceflow.sales.schema import warehouse_tables

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'warehouse.db'}")
    md = sa.MetaData()
    audit = warehouse_tables(md).audit
    md.create_all(engine, checkfirst=True)
    with engine.begin() as conn:
        for key in partitions:
            conn.execute(
                audit.insert().values(
                    table_name=table,
                    partition_key=key,
                    row_count=1,
                    reject_count=0,
                    checksum="x",
                    run_id=f"r{key}",
                    try_number=1,
                    fence_token=1,
                    processing_version="v1",
                    loaded_at_utc=dt.datetime(2024, 1, 1),
                )
            )
    engine.dispose()


@pytest.mark.parametrize(
    ("last_loaded", "start", "first_down_utc", "missing"),
    [
        # Autumn: 27 Oct 2024 has 25 hours; 07:00 CET on the 27th is 06:00 UTC (+30 min grace).
        ("2024-10-25", "2024-10-26T06:00:00+00:00", "2024-10-27T06:30:00+00:00", "2024-10-26"),
        # Spring: 31 Mar 2024 has 23 hours; 07:00 CEST on the 31st is 05:00 UTC.
        ("2024-03-29", "2024-03-30T05:00:00+00:00", "2024-03-31T05:30:00+00:00", "2024-03-30"),
    ],
    ids=["autumn", "spring"],
)
def test_sixty_hours_of_nothing_fires_at_the_first_missed_deadline_across_dst(
    tmp_path: Path, receiver: AlertReceiver, last_loaded: str, start: str, first_down_utc: str, missing: str
) -> None:
    _load_audit(tmp_path, [last_loaded])
    sales = {
        "kind": "business_freshness",
        "table": "daily_sales",
        "deadline_cron": "0 7 * * *",
        "timezone": AMS,
        "period_seconds": 300,
        "grace_seconds": 1800,
    }
    config = make_config(tmp_path, receiver, sales=sales)
    clock = FakeClock(_utc(start))
    wd = Watchdog(config, clock=clock.now)
    states: list[tuple[float, str]] = []
    end = _utc(start) + 60 * 3600
    while clock.now() < end:
        states.append((clock.now(), wd.run_once().states["sales"]))
        clock.advance(300)
    first_down = next(t for t, s in states if s == "down")
    assert first_down == _utc(first_down_utc)
    # up until the deadline, late during the grace, then down for the rest of the 60 hours
    assert {s for t, s in states if t < first_down - 1800} == {"up"}
    assert {s for t, s in states if t >= first_down} == {"down"}
    downs = [m for m in receiver.webhooks() if m["onceflow"]["kind"] == "down"]
    assert len(downs) == 1
    assert downs[0]["onceflow"]["evidence"]["first_missing_partition"] == missing
    # reminders every 600 s of the remaining hours, not a new incident each pass
    assert {m["onceflow"]["incident"] for m in receiver.webhooks()} == {1}
    paged = [m["onceflow"]["queued_at"] for m in receiver.webhooks()]
    assert paged[0] == first_down and len(paged) > 2
    assert {b - a for a, b in itertools.pairwise(paged)} == {600.0}  # not every 300 s pass


def test_each_pass_pings_the_watchdogs_own_heartbeat_url(tmp_path: Path, receiver: AlertReceiver) -> None:
    """Who watches the watchdog: an external healthchecks-style check hears from every pass."""
    raw_config = make_config(tmp_path, receiver)
    config = type(raw_config)(**{**raw_config.__dict__, "self_heartbeat_url": receiver.ping_url("wd-uuid")})
    wd = Watchdog(config, clock=FakeClock(T0).now)
    wd.run_once()
    wd.run_once()
    pings = [r for r in read_records(receiver.store) if r["kind"] == "ping"]
    assert [(p["uuid"], p["signal"]) for p in pings] == [("wd-uuid", "success")] * 2
    assert pings[0]["body"] == "replica=state"


def test_a_watchdog_first_started_60_hours_in_dates_the_incident_from_the_first_missed_deadline(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """No memory of its own (a fresh ledger), only load_audit: the evidence dates the incident."""
    _load_audit(tmp_path, ["2024-10-25"])
    sales = {"kind": "business_freshness", "timezone": AMS, "grace_seconds": 1800}
    clock = FakeClock(_utc("2024-10-26T06:00:00+00:00") + 60 * 3600)
    assert Watchdog(make_config(tmp_path, receiver, sales=sales), clock=clock.now).run_once().states == {
        "sales": "down"
    }
    row = incident_row(tmp_path, "sales")
    assert row["since"] == _utc("2024-10-27T06:30:00+00:00")  # 07:00 CET + grace, the first miss
    evidence = receiver.webhooks()[0]["onceflow"]["evidence"]
    assert evidence["first_missing_partition"] == "2024-10-26"
    assert evidence["expected_partition"] == "2024-10-27"  # due at 07:00 on the 28th


def test_beats_back_but_slow_end_the_incident_and_leave_the_check_late(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """The first beat after a hang often starts late: the scheduler moves again (recovery), slowly."""
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0, T0)
    wd = Watchdog(make_config(tmp_path, receiver), clock=clock.now)
    clock.set(T0 + 600)
    assert wd.run_once().states == {"heartbeat": "down"}
    beat(tmp_path, "queued-before-the-hang", T0 + 555, T0 + 600)  # 45 s lag, max 30
    assert wd.run_once().states == {"heartbeat": "late"}
    assert received(receiver) == [("heartbeat", "down", 1), ("heartbeat", "recovery", 1)]


def test_a_later_partition_or_another_tables_does_not_stand_in_for_the_missing_one(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """Yesterday (the 26th) failed; today's partition was loaded early and another table's
    yesterday is there: the 26th is still missing at 07:00 CET on the 27th."""
    _load_audit(tmp_path, ["2024-10-25", "2024-10-27"])
    _load_audit(tmp_path, ["2024-10-26"], table="returns")
    sales = {"kind": "business_freshness", "timezone": AMS, "grace_seconds": 1800}
    clock = FakeClock(_utc("2024-10-27T07:00:00+00:00"))
    assert Watchdog(make_config(tmp_path, receiver, sales=sales), clock=clock.now).run_once().states == {
        "sales": "down"
    }
    [message] = receiver.webhooks()
    assert message["onceflow"]["evidence"]["first_missing_partition"] == "2024-10-26"
    assert incident_row(tmp_path, "sales")["since"] == _utc("2024-10-27T06:30:00+00:00")


@pytest.mark.parametrize("configured", ["daily_sales", "main.daily_sales", "Daily_Sales"])
def test_a_schema_qualified_table_name_reads_the_partitions_its_loads_wrote(
    tmp_path: Path, receiver: AlertReceiver, configured: str
) -> None:
    """The loads key load_audit by the physical table (sales.table_names): `main.daily_sales`
    and `daily_sales` are one table, so the check must find its partitions under either name."""
    _load_audit(tmp_path, ["2024-10-26"])
    with sa.create_engine(f"sqlite:///{tmp_path / 'warehouse.db'}").begin() as conn:
        conn.exec_driver_sql("CREATE TABLE daily_sales (partition_key TEXT)")  # the loaded table
    sales = {"kind": "business_freshness", "table": configured, "timezone": AMS, "grace_seconds": 1800}
    clock = FakeClock(_utc("2024-10-27T12:00:00+00:00"))  # the 26th was due at 07:00 CET on the 27th
    assert Watchdog(make_config(tmp_path, receiver, sales=sales), clock=clock.now).run_once().states == {
        "sales": "up"
    }
