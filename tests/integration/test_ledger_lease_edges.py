"""Edges of the database clock and of poison items (review of issue 11 defects 1 and 2).

Each test reads back what the ledger stored with plain SQL on the ledger database.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from onceflow.ledger import LeaseHeld, Ledger, create_ledger_engine, states
from onceflow.ledger.reconcile import reconcile


def stored(ledger: Ledger, work_key: str) -> tuple[str, int, int, int]:
    with ledger.engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT state, attempts, max_attempts, fencing_token FROM work_items WHERE work_key = :k"
            ),
            {"k": work_key},
        ).one()
    return row[0], row[1], row[2], row[3]


def events(ledger: Ledger, work_key: str) -> list[tuple[str, str, str | None, int]]:
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT event, actor, owner, fencing_token FROM transitions WHERE work_key = :k ORDER BY id"
            ),
            {"k": work_key},
        ).all()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def test_a_keyed_lease_gives_up_an_expired_last_attempt_instead_of_taking_it_over(ledger, fake_clock):
    """``lease_key`` takes over expired leases too: past the budget it gives the item up first
    (recorded, as a claim does), then this run re-opens it like any failed item."""
    ledger.add("article", "article:r1", max_attempts=2)  # a sheet-registered item: budget 2
    for run in ("run-1", "run-2"):  # each task try is killed holding the lease
        ledger.lease_key("article", "article:r1", run, 30, "v1", reopen_reason="rerun")
        fake_clock.advance(31)

    lease = ledger.lease_key("article", "article:r1", "run-3", 30, "v1", reopen_reason="rerun")

    assert (lease.token, lease.attempts) == (3, 1)
    assert stored(ledger, "article:r1") == (states.LEASED, 1, 2, 3)  # never 3 attempts of 2
    assert events(ledger, "article:r1") == [
        ("create", states.PRODUCER, None, 0),
        ("claim", states.WORKER, "run-1", 1),
        ("reclaim_expired", states.WORKER, "run-2", 2),
        ("give_up_expired", states.WORKER, "run-3", 2),
        ("recheck", states.RECHECK, "run-2", 2),
        ("claim", states.WORKER, "run-3", 3),
    ]
    gave_up = next(t for t in ledger.history("article:r1") if t.event == "give_up_expired")
    assert "lease of run-2 (token 2) expired on attempt 2 of 2" in gave_up.reason


def test_a_keyed_lease_on_a_live_last_attempt_is_still_held(ledger, fake_clock):
    ledger.add("article", "article:r2", max_attempts=1)
    ledger.lease_key("article", "article:r2", "run-1", 30, "v1", reopen_reason="rerun")
    fake_clock.advance(29)
    with pytest.raises(LeaseHeld):
        ledger.lease_key("article", "article:r2", "run-2", 30, "v1", reopen_reason="rerun")
    assert stored(ledger, "article:r2") == (states.LEASED, 1, 1, 1)


@pytest.mark.parametrize("seconds", [0, -30])
def test_a_keyed_lease_or_a_heartbeat_that_would_expire_at_once_is_refused(ledger, seconds):
    """A lease of 0 s or less would hand the item to the next claimer while its holder works."""
    with pytest.raises(ValueError, match="lease_seconds"):
        ledger.lease_key("load", "day:1", "run-1", seconds, "v1", reopen_reason="rerun")
    ledger.add("work", "k:1")
    lease = ledger.claim("work", "w", 60, "v1")
    assert lease is not None
    with pytest.raises(ValueError, match="lease_seconds"):
        ledger.heartbeat(lease, lease_seconds=seconds)

    assert ledger.claim("work", "rival", 60, "v1") is None  # the lease was not shortened
    assert stored(ledger, "k:1") == (states.LEASED, 1, 5, 1)
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM work_items WHERE work_key = 'day:1'")).scalar() == 0


def test_the_ledger_works_on_a_pool_of_one_connection(ledger_url):
    """The default clock is read on the transaction's own connection, not on a second one from
    the pool: on PostgreSQL ``add`` used to wait for a connection its own transaction held."""
    engine = create_ledger_engine(ledger_url, pool_size=1, max_overflow=0, pool_timeout=5)
    try:
        ledger = Ledger(engine)  # the database's clock, as in production
        assert ledger.add("work", "pool:1")
        assert ledger.add_many("work", ["pool:2"]) == 1
        lease = ledger.claim("work", "w", 60, "v1")
        assert lease is not None
        ledger.heartbeat(lease)
        ledger.commit_result(lease, "step", {"ok": True})
        other = ledger.claim("work", "w", 60, "v1")
        assert other is not None
        assert ledger.fail(other, "boom", backoff_seconds=0) == states.PENDING
        keyed = ledger.lease_key("load", "day:1", "run-1", 60, "v1", reopen_reason="rerun")
        assert ledger.release(keyed)
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT work_key, state, available_at <= created_at + 1 FROM work_items ORDER BY work_key"
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            ("day:1", states.PENDING, True), ("pool:1", states.DONE, True), ("pool:2", states.PENDING, True)
        ]  # fmt: skip
    finally:
        engine.dispose()


def test_the_outbox_relay_and_its_reconcile_check_work_on_a_pool_of_one_connection(ledger_url):
    """The relay records a delivery, and check_relay a repair, inside an open transaction; the
    default clock must be read on that transaction's connection (on PostgreSQL a second checkout
    from a pool of one waited out the pool timeout)."""
    from onceflow.ledger import FollowUp
    from onceflow.ledger.outbox import OutboxRelay, confirm_relayed, pending_rows

    class Sink:
        def __init__(self) -> None:
            self.runs: list[tuple[str, str]] = []

        def trigger_dag_run(self, dag_id: str, run_id: str, conf: dict) -> bool:
            self.runs.append((dag_id, run_id))
            return True

        def emit_asset_event(self, uri: str, extra: dict) -> bool:
            return False  # handed to a task's outlet: confirmed later

    engine = create_ledger_engine(ledger_url, pool_size=1, max_overflow=0, pool_timeout=3)
    try:
        ledger = Ledger(engine)  # the database's clock, as in production
        for key in ("relay:1", "relay:2"):
            ledger.add("work", key)
            lease = ledger.claim("work", "w", 60, "v1")
            assert lease is not None
            ledger.commit_result(
                lease, "step", {}, follow_ups=[FollowUp.dag_run("d"), FollowUp.asset_event("x-a://b")]
            )
        sink = Sink()
        first = OutboxRelay(ledger, sink).relay_once()
        assert first.relayed == 4 and first.errors == [] and len(sink.runs) == 2
        assert confirm_relayed(ledger, first.awaiting) == 2
        assert pending_rows(ledger) == []

        ledger.add("work", "relay:3")
        lease = ledger.claim("work", "w", 60, "v1")
        assert lease is not None
        ledger.commit_result(lease, "step", {}, follow_ups=[FollowUp.dag_run("d")])
        report = reconcile(ledger, relay_stall_seconds=0, sink=sink)  # stalled at once: repaired
        assert report.count("stalled_relay", repaired=True) == 1 and len(sink.runs) == 3
        assert ledger.history("relay:3")[-1].event == "repair_follow_up"
    finally:
        engine.dispose()


def test_a_sink_commit_under_a_given_up_last_attempt_is_still_recorded(ledger, fake_clock):
    """The holder's sink (the warehouse, the sheet) committed under its token, then the holder died
    before ``commit_result`` on the item's last attempt. The reconciler gives the item up; its
    sink-result check must still be able to record the committed result (no newer lease exists),
    or the ledger says failed while the sink holds the work done."""
    ledger.add("load", "day:1", max_attempts=1)
    lease = ledger.claim("load", "loader", 30, "v1")
    assert lease is not None  # ... the warehouse commits under lease.token; the loader dies
    fake_clock.advance(31)
    reconcile(ledger)  # gives the poison item up
    assert stored(ledger, "day:1")[0] == states.FAILED

    recorded = ledger.record_result(
        "day:1", "load", "v1", lease.token, {"rows": 3}, reason="warehouse committed under token 1"
    )

    assert recorded and stored(ledger, "day:1")[0] == states.DONE


def test_a_failed_item_refuses_the_result_of_an_attempt_older_than_its_last(ledger, fake_clock):
    """Only the last attempt's sink commit may turn a failed item done: an older attempt's was
    overtaken by a newer lease, whose outcome (the give-up) stands."""
    ledger.add("load", "day:2", max_attempts=2)
    first = ledger.claim("load", "loader", 30, "v1")
    assert first is not None
    fake_clock.advance(31)
    second = ledger.claim("load", "loader", 30, "v1")  # takes the expired lease over: attempt 2 of 2
    assert second is not None and second.token > first.token
    fake_clock.advance(31)
    reconcile(ledger)  # the last attempt expired: given up
    assert stored(ledger, "day:2")[0] == states.FAILED

    assert not ledger.record_result("day:2", "load", "v1", first.token, {"rows": 1}, reason="old attempt")
    assert stored(ledger, "day:2")[0] == states.FAILED
    assert ledger.record_result("day:2", "load", "v1", second.token, {"rows": 2}, reason="last attempt")
    assert stored(ledger, "day:2")[0] == states.DONE
