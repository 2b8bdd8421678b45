"""The ledger's lease, fence and state rules, on SQLite and PostgreSQL (``ledger`` fixture)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from onceflow.ledger import FollowUp, IllegalTransition, StaleFenceError, states
from onceflow.ledger.outbox import pending_rows

LEASE = 30.0


def table_snapshot(ledger, name):
    with ledger.engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {name}")))


def snapshot(ledger):
    return {t: table_snapshot(ledger, t) for t in ("work_items", "transitions", "results", "outbox")}


def test_claim_grants_a_lease_and_increments_the_fencing_token(ledger):
    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    assert lease is not None and lease.token == 1 and lease.owner == "w1"
    item = ledger.item("a:1")
    assert item.state == "leased" and item.fencing_token == 1 and item.attempts == 1
    assert item.lease_expires_at == ledger.clock.now() + LEASE
    assert ledger.claim("fetch", "w2", LEASE, "v1") is None


def test_it_hands_out_higher_priority_first_and_waits_for_available_at(ledger, fake_clock):
    ledger.add("fetch", "low", priority=0)
    ledger.add("fetch", "high", priority=5)
    ledger.add("fetch", "later", priority=9, available_at=fake_clock.now() + 100)
    assert ledger.claim("fetch", "w", LEASE, "v1").work_key == "high"
    assert ledger.claim("fetch", "w", LEASE, "v1").work_key == "low"
    assert ledger.claim("fetch", "w", LEASE, "v1") is None
    fake_clock.advance(100)
    assert ledger.claim("fetch", "w", LEASE, "v1").work_key == "later"


def test_a_worker_running_other_code_leaves_a_versioned_item_alone(ledger):
    ledger.add("translate", "t:1", required_version="v2")
    assert ledger.claim("translate", "old-worker", LEASE, "v1") is None
    assert ledger.item("t:1").state == "pending"
    assert [t.event for t in ledger.history("t:1")] == ["create"]
    lease = ledger.claim("translate", "new-worker", LEASE, "v2")
    assert lease is not None
    assert ledger.commit_result(lease, "translate", {"ok": True}).processing_version == "v2"


def test_heartbeat_extends_the_lease_and_a_lost_lease_cannot_heartbeat(ledger, fake_clock):
    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    fake_clock.advance(20)
    lease.heartbeat()
    assert ledger.item("a:1").lease_expires_at == fake_clock.now() + LEASE
    fake_clock.advance(20)  # 40 s after the claim, still inside the extended lease
    assert ledger.claim("fetch", "w2", LEASE, "v1") is None
    fake_clock.advance(LEASE)
    newer = ledger.claim("fetch", "w2", LEASE, "v1")
    assert newer.token == 2
    with pytest.raises(StaleFenceError):
        lease.heartbeat()


def test_a_late_commit_after_the_lease_was_reclaimed_is_refused_and_recorded(ledger, fake_clock):
    ledger.add("fetch", "a:1")
    old = ledger.claim("fetch", "w1", LEASE, "v1")
    fake_clock.advance(LEASE + 1)
    new = ledger.claim("fetch", "w2", LEASE, "v1")
    with pytest.raises(StaleFenceError) as info:
        ledger.commit_result(old, "fetch", {"by": "w1"}, follow_ups=[FollowUp.dag_run("article_pipeline")])
    assert info.value.token == 1 and info.value.current_token == 2
    assert ledger.results("a:1") == []
    assert pending_rows(ledger) == []
    refused = [t for t in ledger.history("a:1") if t.event == "commit_refused"]
    assert len(refused) == 1 and refused[0].owner == "w1" and refused[0].fencing_token == 1
    ledger.commit_result(new, "fetch", {"by": "w2"})
    assert [r.payload for r in ledger.results("a:1")] == [{"by": "w2"}]


def test_a_commit_after_the_reconciler_expired_the_lease_is_refused(ledger, fake_clock):
    from onceflow.ledger.reconcile import reconcile

    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    fake_clock.advance(LEASE + 1)
    assert reconcile(ledger).count("expired_lease") == 1
    with pytest.raises(StaleFenceError):
        ledger.commit_result(lease, "fetch", {})
    assert ledger.item("a:1").state == "pending"


def test_repeating_a_successful_commit_with_the_same_lease_changes_nothing(ledger):
    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    first = ledger.commit_result(lease, "fetch", {"n": 1}, follow_ups=[FollowUp.asset_event("file:///x")])
    before = snapshot(ledger)
    again = ledger.commit_result(lease, "fetch", {"n": 1}, follow_ups=[FollowUp.asset_event("file:///x")])
    assert again == first
    assert snapshot(ledger) == before


def test_result_and_follow_ups_are_written_in_one_transaction(ledger):
    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    before = snapshot(ledger)
    broken = FollowUp.work_item(None, "a:1:next")  # type: ignore[arg-type]  # NOT NULL violation
    with pytest.raises(sa.exc.IntegrityError):
        ledger.commit_result(lease, "fetch", {"n": 1}, follow_ups=[FollowUp.dag_run("d"), broken])
    assert snapshot(ledger) == before
    ledger.commit_result(
        lease,
        "fetch",
        {"n": 1},
        follow_ups=[FollowUp.dag_run("d"), FollowUp.work_item("translate", "a:1:tr")],
    )
    assert [r.target for r in pending_rows(ledger)] == ["d"]
    assert ledger.item("a:1:tr").state == "pending"
    assert ledger.item("a:1").state == "done"


def test_a_transient_failure_retries_later_then_gives_up(ledger, fake_clock):
    ledger.add("fetch", "a:1", max_attempts=2)
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    assert ledger.fail(lease, TimeoutError("provider slow"), backoff_seconds=60) == "pending"
    item = ledger.item("a:1")
    assert item.available_at == fake_clock.now() + 60 and item.last_error_class == "TimeoutError"
    assert ledger.claim("fetch", "w1", LEASE, "v1") is None
    fake_clock.advance(60)
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    assert ledger.fail(lease, TimeoutError("again")) == "failed"
    assert [t.event for t in ledger.history("a:1")] == ["create", "claim", "retry", "claim", "give_up"]


def test_invalid_input_waits_for_a_correction(ledger):
    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    ledger.mark_invalid(lease, "url is not a URL")
    assert ledger.item("a:1").state == "needs_correction"
    assert ledger.claim("fetch", "w1", LEASE, "v1") is None
    ledger.transition("a:1", "correct", states.OPERATOR, reason="editor fixed the url")
    assert ledger.claim("fetch", "w1", LEASE, "v1").attempts == 1


@pytest.mark.parametrize(
    ("event", "actor", "reason"),
    [
        ("correct", states.OPERATOR, "x"),  # the item is not in needs_correction
        ("recheck", states.RECHECK, "x"),  # pending work cannot be re-opened
        ("expire", states.RECONCILER, None),  # nothing is leased
        ("cancel", states.WORKER, "x"),  # workers may not cancel
        ("cancel", states.OPERATOR, None),  # cancelling needs a reason
        ("complete", states.OPERATOR, "x"),  # only through a fenced commit
        ("teleport", states.OPERATOR, "x"),  # not in the table at all
    ],
)
def test_an_illegal_transition_raises_and_changes_nothing(ledger, event, actor, reason):
    ledger.add("fetch", "a:1")
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition):
        ledger.transition("a:1", event, actor, reason=reason)
    assert snapshot(ledger) == before


def test_expiring_a_live_lease_is_illegal(ledger):
    ledger.add("fetch", "a:1")
    ledger.claim("fetch", "w1", LEASE, "v1")
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition, match="lease_expired"):
        ledger.transition("a:1", "expire", states.RECONCILER)
    assert snapshot(ledger) == before


def test_release_gives_the_item_back_without_spending_an_attempt(ledger):
    ledger.add("fetch", "a:1")
    lease = ledger.claim("fetch", "w1", LEASE, "v1")
    assert lease.release("shutdown") is True
    item = ledger.item("a:1")
    assert item.state == "pending" and item.attempts == 0
    assert lease.release("again") is False


def test_every_recorded_transition_is_one_the_state_table_allows(ledger, fake_clock):
    for i in range(4):
        ledger.add("fetch", f"k{i}", max_attempts=1)
    a = ledger.claim("fetch", "w", LEASE, "v1")
    ledger.commit_result(a, "fetch", {})
    b = ledger.claim("fetch", "w", LEASE, "v1")
    ledger.fail(b, "Boom")
    c = ledger.claim("fetch", "w", LEASE, "v1")
    ledger.mark_invalid(c, "bad")
    d = ledger.claim("fetch", "w", LEASE, "v1")
    fake_clock.advance(LEASE)
    ledger.claim("fetch", "w2", LEASE, "v1")
    with pytest.raises(StaleFenceError):
        ledger.commit_result(d, "fetch", {})
    with ledger.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT event, from_state, to_state, actor FROM transitions")).all()
    assert len(rows) >= 12
    assert [r for r in rows if not states.allowed(*r)] == []


@pytest.mark.parametrize(("lease_seconds", "limit", "why"), [(0, 1, "lease_seconds"), (30, 0, "limit")])
def test_a_claim_without_a_lease_length_or_a_limit_is_refused_clearly(ledger, lease_seconds, limit, why):
    ledger.add("fetch", "a:1")
    with pytest.raises(ValueError, match=why):
        ledger.claim_many("fetch", "w", lease_seconds, "v1", limit=limit)
    assert ledger.item("a:1").state == "pending"
