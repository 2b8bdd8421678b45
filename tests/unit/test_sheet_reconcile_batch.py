"""sheet_reconcile's plan for rows of the batch lane (their ledger item names an ``article_batch``
run and no ``article_pipeline`` run exists): left to the batch while it runs, re-driven alone in
``article_pipeline`` once it has ended without the row's outcome.

Pure planning (no I/O): the sheet is a Snapshot, run states and ledger items are dictionaries.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from onceflow.sheets import reconcile
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.ledger_link import LedgerView
from onceflow.sheets.model import Snapshot, Status

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
OLD = "20260105T100000Z-aa"  # claimed two hours before T0: past the 30-minute lease
URL = "https://a.example/1"
KEY = row_key(normalise_url(URL))
RUN = pipeline_run_id(KEY, "v1")
BATCH = f"batch__{OLD}"


def batch_view(state: str = "done", *, token: str = OLD, outcome: bool = False) -> LedgerView:
    return LedgerView(state, False, "", 5, batch_run=BATCH, batch_token=token, outcome=outcome)


def plan(status: str, view: LedgerView, runs: dict[str, str], batches: dict[str, str]) -> reconcile.Plan:
    return reconcile.plan(
        Snapshot.from_values([HEADER, [URL, f"{status} #{OLD}"]]),
        now=T0,
        lease=timedelta(minutes=30),
        version="v1",
        run_state=runs.get,
        audit=[],
        ledger={KEY: view}.get,
        batch_state=batches.get,
    )


@pytest.mark.parametrize("state", ["queued", "running"])
@pytest.mark.parametrize("status", ["PROCESSING", "NEEDS_REVIEW"])
def test_a_row_of_a_batch_that_is_queued_or_running_is_left_to_it_past_the_lease(
    state: str, status: str
) -> None:
    # a review in a batch run can take days: its row holds no run of its own, and needs none
    p = plan(status, batch_view(), {}, {BATCH: state})
    assert p.actions == [] and p.released == []


@pytest.mark.parametrize("ended", ["failed", "success", None])
def test_a_batch_that_ended_without_the_rows_outcome_has_the_row_re_driven_alone(ended: str | None) -> None:
    p = plan("PROCESSING", batch_view("pending"), {}, {BATCH: ended} if ended else {})
    [action] = p.actions
    assert (action.kind, action.run_id) == ("create_run", RUN)
    state = f"ended {ended}" if ended else "is gone"
    assert action.reason == reconcile.REDRIVE_BATCH.format(run=BATCH, state=state)


def test_once_re_driven_the_row_is_repaired_like_any_per_article_row() -> None:
    assert plan("PROCESSING", batch_view(), {RUN: "running"}, {BATCH: "failed"}).actions == []
    p = plan("PROCESSING", batch_view(), {RUN: "failed"}, {BATCH: "failed"})
    assert [(a.kind, a.run_id) for a in p.actions] == [("reset_run", RUN)]


def test_a_batch_that_committed_the_rows_outcome_is_flagged_not_re_driven() -> None:
    # publish committed the row's DONE to the outbox: the next relay pass writes it
    p = plan("PROCESSING", batch_view(outcome=True), {}, {BATCH: "success"})
    assert [(a.kind, a.reason) for a in p.actions] == [
        ("flag", reconcile.BATCH_NOT_WRITTEN.format(run=BATCH))
    ]
    assert p.released == [OLD]


def test_an_item_registered_by_another_claim_does_not_make_the_row_a_batch_row() -> None:
    # the item's payload names a batch under another claim (this row is a second claim of it)
    p = plan("PROCESSING", batch_view(token="20260105T090000Z-cc"), {}, {BATCH: "running"})
    assert [(a.kind, a.reason) for a in p.actions] == [("create_run", reconcile.REDRIVE_MISSING)]


def test_a_failed_item_waits_for_its_running_batch_before_the_row_is_failed() -> None:
    # the batch relays the FAILED itself; once it has ended, the ledger's verdict is carried over
    view = LedgerView("needs_correction", False, "fetch: HTTP 404", 5, batch_run=BATCH, batch_token=OLD)
    assert plan("PROCESSING", view, {}, {BATCH: "running"}).actions == []
    p = plan("PROCESSING", view, {}, {BATCH: "success"})
    assert [(a.kind, a.new_status) for a in p.actions] == [("transition", Status.INVALID)]
