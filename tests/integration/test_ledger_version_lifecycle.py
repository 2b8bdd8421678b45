"""Review of issue 11 defect 3: a version requirement must not outlive the deployment that met it.

A ``new_version`` recheck pins items to ``required_version="v2"``; the v2 deployment reprocesses
them. Before the fix the requirement was never cleared and a later recheck without a target
version (``stale``) kept it, so after the next deployment (v3) the item could never be rechecked
or leased again (the recheck lane left it "for a worker running v2", a keyed step deferred
forever). Policy (docs/ledger.md, version policy): a requirement is a pin for the recheck that set
it, cleared (and the clearing recorded in the ``complete`` reason) when the item completes at that
version; a recheck without a target version sets no pin. Read back with plain SQL.
"""

from __future__ import annotations

import pytest

from onceflow.ledger import WrongVersion
from onceflow.ledger.recheck import RecheckRequest, start_recheck, waiting_for_other_versions


def test_an_item_rechecked_at_v2_can_be_rechecked_and_leased_after_the_v3_deployment(ledger):
    ledger.add("article", "a:1")
    lease = ledger.claim("article", "w-v1", 60, "v1")
    assert lease is not None
    ledger.commit_result(lease, "fetch", {"by": "v1"})

    # v2 deployment: its new_version recheck, processed by a v2 worker
    start_recheck(ledger, RecheckRequest("new_version", "parser v2", "article", target_version="v2"))
    lease = ledger.claim("article", "w-v2", 60, "v2", lane="recheck")
    assert lease is not None
    ledger.commit_result(lease, "fetch", {"by": "v2"})

    with ledger.engine.connect() as conn:
        after_v2 = conn.exec_driver_sql(
            "SELECT w.required_version, t.reason FROM work_items w JOIN transitions t"
            " ON t.work_key = w.work_key AND t.event = 'complete'"
            " WHERE w.work_key = 'a:1' ORDER BY t.id DESC LIMIT 1"
        ).one()
    assert tuple(after_v2) == (None, "required version v2 met: requirement cleared")

    # v3 deployment: a stale recheck (no target version) and a keyed step, both on v3 workers
    start_recheck(ledger, RecheckRequest("stale", "monthly refresh", "article", stale_after_seconds=0))
    with ledger.engine.connect() as conn:
        required = conn.exec_driver_sql(
            "SELECT required_version FROM work_items WHERE work_key = 'a:1'"
        ).scalar_one()
    assert (required, waiting_for_other_versions(ledger, "article", "v3")) == (None, {})
    taken = ledger.claim("article", "w-v3", 60, "v3", lane="recheck")
    assert taken is not None
    ledger.commit_result(taken, "fetch", {"by": "v3"})
    try:
        keyed = ledger.lease_key("article", "a:1", "w-v3-keyed", 60, "v3", reopen_reason="new run")
    except WrongVersion as exc:
        pytest.fail(f"a keyed v3 step is refused: {exc}")
    assert keyed.token == taken.token + 1


def test_a_recheck_with_its_own_target_pins_until_that_version_completes(ledger):
    ledger.add("article", "a:2")
    lease = ledger.claim("article", "w-v1", 60, "v1")
    assert lease is not None
    ledger.commit_result(lease, "fetch", {"by": "v1"})
    start_recheck(ledger, RecheckRequest("new_version", "parser v3", "article", target_version="v3"))
    assert ledger.claim("article", "w-v2", 60, "v2", lane="recheck") is None
    assert waiting_for_other_versions(ledger, "article", "v2") == {"v3": 1}
    assert ledger.claim("article", "w-v3", 60, "v3", lane="recheck") is not None
