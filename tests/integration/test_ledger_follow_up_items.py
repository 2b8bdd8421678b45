"""Review of issue 11 defect 5: a recheck at the same version must bring its ``work_item`` follow-ups.

Outbox follow-ups (DAG runs, Asset events) are keyed by the committing attempt, but a
``work_item`` follow-up is keyed by the next item's work key and creating it ignores an existing
item. Before the fix a recheck of ``fetch`` committed a new result whose ``translate`` follow-up
already existed (``done``, from the old fetch), so nothing re-ran it and the reconciler saw
nothing missing. Policy (docs/ledger.md, Outbox): a re-committed result re-opens its finished
next item with an audited ``recheck`` transition into the recheck lane (the parent's priority and
recheck id), once per committing lease; a pending or leased next item is left alone. Read back
with plain SQL on the ledger database.
"""

from __future__ import annotations

from onceflow.ledger import FollowUp
from onceflow.ledger.recheck import RecheckRequest, start_recheck
from onceflow.ledger.reconcile import reconcile


def test_a_recheck_at_the_same_version_brings_its_next_item_again(ledger, fake_clock):
    follow_ups = [FollowUp.work_item("translate", "a:1/translate")]
    ledger.add("fetch", "a:1")
    fetch = ledger.claim("fetch", "w", 30, "v1")
    assert fetch is not None
    ledger.commit_result(fetch, "fetch", {"text": "old"}, follow_ups=follow_ups)
    translate = ledger.claim("translate", "w", 30, "v1")
    assert translate is not None
    ledger.commit_result(translate, "translate", {"from": "old"})

    fake_clock.advance(60)
    start_recheck(ledger, RecheckRequest("stale", "source page changed", "fetch", stale_after_seconds=30))
    again = ledger.claim("fetch", "w2", 30, "v1", lane="recheck")  # same version, a new lease
    assert again is not None
    ledger.commit_result(again, "fetch", {"text": "new"}, follow_ups=follow_ups)

    with ledger.engine.connect() as conn:
        state = conn.exec_driver_sql(
            "SELECT state FROM work_items WHERE work_key = 'a:1/translate'"
        ).scalar_one()
    findings = reconcile(ledger).findings
    assert state in ("pending", "leased") or findings, "the recheck's translate follow-up vanished"


def _translate_rows(ledger):
    with ledger.engine.connect() as conn:
        item = conn.exec_driver_sql(
            "SELECT state, lane, priority, recheck_id FROM work_items WHERE work_key = 'a:1/translate'"
        ).one()
        reopens = conn.exec_driver_sql(
            "SELECT actor, reason FROM transitions WHERE work_key = 'a:1/translate' AND event = 'recheck'"
            " ORDER BY id"
        ).all()
    return tuple(item), [tuple(r) for r in reopens]


def test_each_recommitted_result_reopens_its_next_item_once_in_the_recheck_lane(ledger, fake_clock):
    follow_ups = [FollowUp.work_item("translate", "a:1/translate")]
    ledger.add("fetch", "a:1")
    fetch = ledger.claim("fetch", "w", 30, "v1")
    assert fetch is not None
    ledger.commit_result(fetch, "fetch", {"text": "old"}, follow_ups=follow_ups)
    translate = ledger.claim("translate", "w", 30, "v1")
    assert translate is not None
    ledger.commit_result(translate, "translate", {"from": "old"})

    fake_clock.advance(60)
    rc = start_recheck(
        ledger, RecheckRequest("stale", "source changed", "fetch", stale_after_seconds=30, priority=7)
    )
    again = ledger.claim("fetch", "w2", 30, "v1", lane="recheck")
    assert again is not None
    ledger.commit_result(again, "fetch", {"text": "new"}, follow_ups=follow_ups)
    ledger.commit_result(again, "fetch", {"text": "new"}, follow_ups=follow_ups)  # a retried commit
    reason = f"follow-up of a:1 fetch re-committed under token {again.token}"
    assert _translate_rows(ledger) == (("pending", "recheck", 7, rc.recheck_id), [("recheck", reason)])
    assert ledger.claim("translate", "w", 30, "v1") is None  # new work's lane never sees it
    redo = ledger.claim("translate", "w", 30, "v1", lane="recheck")
    assert redo is not None
    ledger.commit_result(redo, "translate", {"from": "new"})

    # A second recheck of fetch (a new lease, so a new key) re-opens the finished translate again.
    _recheck_fetch(ledger, fake_clock, follow_ups, "w3")
    state, reopens = _translate_rows(ledger)
    assert (state[0], len(reopens)) == ("pending", 2)
    # While translate is pending, then leased, further rechecks of fetch leave it alone.
    _recheck_fetch(ledger, fake_clock, follow_ups, "w4")
    assert _translate_rows(ledger)[0][0] == "pending" and len(_translate_rows(ledger)[1]) == 2
    assert ledger.claim("translate", "w", 30, "v1", lane="recheck") is not None
    _recheck_fetch(ledger, fake_clock, follow_ups, "w5")
    assert _translate_rows(ledger)[0][0] == "leased" and len(_translate_rows(ledger)[1]) == 2


def _recheck_fetch(ledger, fake_clock, follow_ups, owner):
    fake_clock.advance(60)
    assert start_recheck(ledger, RecheckRequest("stale", owner, "fetch", stale_after_seconds=30)).work_keys
    lease = ledger.claim("fetch", owner, 30, "v1", lane="recheck")
    assert lease is not None
    ledger.commit_result(lease, "fetch", {"text": owner}, follow_ups=follow_ups)
