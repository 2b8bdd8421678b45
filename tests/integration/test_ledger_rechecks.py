"""Rechecks: scope, reason, target version, priority and cap; the reason is queryable afterwards."""

from __future__ import annotations

import pytest

from onceflow.ledger.recheck import RecheckRequest, recheck_report, rechecks_by_reason, start_recheck

DAY = 86400.0


def finish(ledger, n, kind="fetch", version="v1"):
    ledger.add_many(kind, [f"{kind}:{i}" for i in range(n)])
    for _ in range(n):
        lease = ledger.claim(kind, "w", 30, version)
        ledger.commit_result(lease, kind, {"v": version})


def test_a_stale_recheck_reopens_the_oldest_finished_items_in_the_recheck_lane(ledger, fake_clock):
    finish(ledger, 5)
    fake_clock.advance(31 * DAY)
    result = start_recheck(
        ledger,
        RecheckRequest(
            scope="stale", reason="pages older than 30 days", kind="fetch", max_items=3, priority=2
        ),
    )
    assert len(result.work_keys) == 3
    assert ledger.claim("fetch", "normal-worker", 30, "v1") is None  # rechecks don't take the new lane
    lease = ledger.claim("fetch", "recheck-worker", 30, "v1", lane="recheck")
    assert lease.work_key in result.work_keys and lease.reason == "pages older than 30 days"
    ledger.commit_result(lease, "fetch", {"v": "v1", "rechecked": True})
    assert [r.payload for r in ledger.results(lease.work_key)] == [{"v": "v1", "rechecked": True}]
    report = recheck_report(ledger, result.recheck_id)
    assert report["reason"] == "pages older than 30 days" and report["selected"] == 3
    assert report["by_state"] == {"done": 1, "pending": 2} and report["results_written"] == 1
    assert rechecks_by_reason(ledger)[0]["scope"] == "stale"
    history = ledger.history(result.work_keys[1])
    assert history[-1].event == "recheck" and "pages older than 30 days" in history[-1].reason


def test_a_new_version_recheck_is_only_taken_by_workers_running_that_version(ledger):
    finish(ledger, 3)
    result = start_recheck(
        ledger, RecheckRequest(scope="new_version", reason="model v2", kind="fetch", target_version="v2")
    )
    assert len(result.work_keys) == 3
    assert ledger.claim("fetch", "old", 30, "v1", lane="recheck") is None
    lease = ledger.claim("fetch", "new", 30, "v2", lane="recheck")
    ledger.commit_result(lease, "fetch", {"v": "v2"})
    assert sorted(r.processing_version for r in ledger.results(lease.work_key)) == ["v1", "v2"]
    again = start_recheck(
        ledger, RecheckRequest(scope="new_version", reason="model v2", kind="fetch", target_version="v2")
    )
    assert again.work_keys == []  # the done one has a v2 result; the others are not done


def test_a_failed_window_recheck_takes_items_that_gave_up_inside_the_window(ledger, fake_clock):
    ledger.add("fetch", "early", max_attempts=1)
    ledger.add("fetch", "inside", max_attempts=1)
    start = fake_clock.now()
    ledger.fail(ledger.claim("fetch", "w", 30, "v1"), "ProviderDown")
    fake_clock.advance(3600)
    ledger.fail(ledger.claim("fetch", "w", 30, "v1"), "ProviderDown")
    result = start_recheck(
        ledger,
        RecheckRequest(
            scope="failed_window",
            reason="provider outage",
            kind="fetch",
            window_start=start + 1800,
            window_end=start + 7200,
        ),
    )
    assert result.work_keys == ["inside"]


def test_a_quality_sample_is_reproducible_and_capped(ledger):
    finish(ledger, 20)
    keys = start_recheck(
        ledger,
        RecheckRequest(scope="quality_sample", reason="weekly QA", kind="fetch", max_items=4, seed="wk1"),
    ).work_keys
    assert len(keys) == 4
    from onceflow.ledger.recheck import select_candidates

    # The same seed over the same candidates picks the same sample.
    others = select_candidates(
        ledger,
        RecheckRequest(scope="quality_sample", reason="weekly QA", kind="fetch", max_items=4, seed="wk1"),
    )
    assert set(keys).isdisjoint(others)  # those four are pending now, no longer candidates


@pytest.mark.parametrize(
    "request_kwargs",
    [
        {"scope": "everything", "reason": "x"},
        {"scope": "stale", "reason": "  "},
        {"scope": "new_version", "reason": "x"},
        {"scope": "failed_window", "reason": "x"},
        {"scope": "stale", "reason": "x", "max_items": 0},
    ],
)
def test_an_incomplete_recheck_request_is_refused(sqlite_ledger, request_kwargs):
    with pytest.raises(ValueError):
        start_recheck(sqlite_ledger, RecheckRequest(kind="fetch", **request_kwargs))
    assert rechecks_by_reason(sqlite_ledger) == []
