"""Review of issue 11 defect 3: a version requirement outlives the deployment that met it.

A ``new_version`` recheck pins items to ``required_version="v2"``; the v2 deployment reprocesses
them and they are ``done``. The requirement is never cleared, and a later recheck without a
target version (``stale``) keeps it. After the next deployment (v3) nothing runs v2 any more, so
the item can never be rechecked or leased again: the recheck lane leaves it forever ("left for a
worker running v2") and a keyed step (``article_pipeline``) defers forever. Read back with plain
SQL on the ledger database.

Known defect, not fixed in the review (which version may take an item once its requirement is met
is a policy choice: versions are unordered strings); ``strict`` so the fix has to remove the mark.
"""

from __future__ import annotations

import pytest

from onceflow.ledger import WrongVersion
from onceflow.ledger.recheck import RecheckRequest, start_recheck, waiting_for_other_versions


@pytest.mark.xfail(strict=True, reason="issue 11 review: required_version is never cleared once met")
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

    # v3 deployment: a stale recheck (no target version) and a keyed step, both on v3 workers
    start_recheck(ledger, RecheckRequest("stale", "monthly refresh", "article", stale_after_seconds=0))
    with ledger.engine.connect() as conn:
        required = conn.exec_driver_sql(
            "SELECT required_version FROM work_items WHERE work_key = 'a:1'"
        ).scalar_one()
    stuck = waiting_for_other_versions(ledger, "article", "v3")
    taken = ledger.claim("article", "w-v3", 60, "v3", lane="recheck")
    try:
        keyed = ledger.lease_key("article", "a:1", "w-v3-keyed", 60, "v3", reopen_reason="new run")
    except WrongVersion:
        keyed = None
    assert (stuck, taken is not None or keyed is not None) == ({}, True), f"still requires {required}"
