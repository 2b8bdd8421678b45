"""The state table itself: well-formed, and ``check`` enforces actor, source state and preconditions."""

from __future__ import annotations

import pytest

from onceflow.ledger import IllegalTransition, states
from onceflow.ledger.queries import query, query_names


def test_the_state_table_only_names_known_states_actors_and_preconditions():
    assert len({t.event for t in states.STATE_TABLE}) == len(states.STATE_TABLE)
    for t in states.STATE_TABLE:
        assert t.sources <= states.STATES | {None}, t.event
        assert t.target is None or t.target in states.STATES, t.event
        assert t.actors and t.actors <= states.ACTORS, t.event
        assert set(t.requires) <= set(states.PRECONDITIONS), t.event
        assert t.doc


def test_every_state_can_be_left_except_cancelled():
    leavable = {s for t in states.STATE_TABLE for s in t.sources if t.target not in (None, s)}
    assert states.STATES - leavable == {states.CANCELLED}


def test_only_workers_holding_a_lease_move_work_forward():
    for event in ("claim", "complete", "retry", "give_up", "invalid_input", "release"):
        assert states.BY_EVENT[event].actors == {states.WORKER}
        assert event in states.LEASE_EVENTS
    assert "correct" not in states.LEASE_EVENTS and "expire" not in states.LEASE_EVENTS


ITEM = {"work_key": "k", "state": "leased", "fencing_token": 3, "lease_expires_at": 100.0, "available_at": 0.0,
        "attempts": 1, "max_attempts": 3, "required_version": None}  # fmt: skip


@pytest.mark.parametrize(
    ("event", "actor", "ctx", "why"),
    [
        ("complete", states.OPERATOR, {"now": 0, "token": 3, "result_written": True}, "only"),
        ("complete", states.WORKER, {"now": 0, "token": 2, "result_written": True}, "lease_current"),
        ("complete", states.WORKER, {"now": 0, "token": 3}, "result_written"),
        ("expire", states.RECONCILER, {"now": 99.0}, "lease_expired"),
        ("correct", states.OPERATOR, {"now": 0, "reason": "x"}, "allowed only from"),
        ("warp", states.OPERATOR, {"now": 0}, "no such event"),
    ],
)
def test_check_refuses_with_the_reason(event, actor, ctx, why):
    with pytest.raises(IllegalTransition, match=why):
        states.check(event, ITEM, actor, ctx)


def test_check_allows_a_legal_event():
    row = states.check("complete", ITEM, states.WORKER, {"now": 0, "token": 3, "result_written": True})
    assert row.target == states.DONE
    assert states.check("expire", ITEM, states.RECONCILER, {"now": 100.0}).target == states.PENDING


def test_allowed_matches_recorded_rows():
    assert states.allowed("claim", "pending", "leased", "worker")
    assert states.allowed("commit_refused", "done", "done", "worker")
    assert not states.allowed("commit_refused", "done", "pending", "worker")
    assert not states.allowed("claim", "done", "leased", "worker")


def test_every_named_query_loads():
    names = query_names()
    assert {
        "claim_postgresql",
        "pick_sqlite",
        "lease_sqlite",
        "heartbeat_postgresql",
        "outbox_pick_postgresql",
    } <= set(names)
    for name in names:
        assert query(name).text.strip()
    with pytest.raises(KeyError):
        query("does_not_exist")
