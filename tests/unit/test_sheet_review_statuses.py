"""NEEDS_REVIEW and REJECTED in the queue's rules: parsing, duplicates, finality, reconcile.

Pure planning (no I/O), as in test_sheet_reconcile_claims.py: the sheet is a Snapshot, Airflow's
runs and the ledger are dictionaries. tests/integration/test_article_writeback.py writes these
statuses through the Sheets emulator.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from onceflow.ledger import states
from onceflow.sheets import reconcile
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.ledger_link import LedgerView
from onceflow.sheets.model import LIVE_STATUSES, Snapshot, Status, StatusCell, new_token
from onceflow.sheets.settle import FINAL_STATUSES
from onceflow.sheets.validation import classify_new_rows

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
CLAIMED = T0 - timedelta(days=3)  # a review can take days: far past the 30-minute lease
URL = "https://a.example/review-me"
KEY = row_key(normalise_url(URL))
RUN = pipeline_run_id(KEY, "v1")
TOKEN = new_token(CLAIMED, "0a1b2c3d4e", "v1")


def plan(
    rows: list[list[str]], runs: dict[str, str], ledger: dict[str, LedgerView] | None = None
) -> reconcile.Plan:
    return reconcile.plan(
        Snapshot.from_values([HEADER, *rows]),
        now=T0,
        lease=timedelta(minutes=30),
        version="v1",
        run_state=runs.get,
        audit=[],
        ledger=None if ledger is None else ledger.get,
    )


def kinds(p: reconcile.Plan) -> list[tuple[str, Status | None]]:
    return [(a.kind, a.new_status) for a in p.actions]


def test_the_new_statuses_parse_and_are_classified() -> None:
    assert StatusCell.parse(f" needs_review #{TOKEN}").status is Status.NEEDS_REVIEW
    assert StatusCell.parse(f"Rejected #{TOKEN}").status is Status.REJECTED
    assert Status.NEEDS_REVIEW in LIVE_STATUSES and Status.REJECTED in LIVE_STATUSES
    assert Status.REJECTED in FINAL_STATUSES and Status.NEEDS_REVIEW not in FINAL_STATUSES


@pytest.mark.parametrize("status", ["NEEDS_REVIEW", "REJECTED"])
def test_a_new_row_of_an_article_in_review_or_rejected_is_a_duplicate(status: str) -> None:
    snapshot = Snapshot.from_values([HEADER, [URL, f"{status} #{TOKEN}"], [URL, "NEW"]])
    (verdict,) = classify_new_rows(snapshot)
    assert verdict.status is Status.DUPLICATE and verdict.reason == f"duplicate of row 2 ({URL})"


@pytest.mark.parametrize("state", ["running", "queued"])
def test_a_row_waiting_for_its_reviewer_is_left_alone_past_the_lease(state: str) -> None:
    p = plan([[URL, f"NEEDS_REVIEW #{TOKEN}", "score 0.41 below 0.60"]], {RUN: state})
    assert p.actions == [] and p.released == []
    leased = {KEY: LedgerView(states.LEASED, False, "", 3)}
    assert plan([[URL, f"NEEDS_REVIEW #{TOKEN}"]], {RUN: state}, leased).actions == []


def test_a_row_in_review_whose_run_is_gone_or_failed_is_re_driven_under_its_run_id() -> None:
    gone = plan([[URL, f"NEEDS_REVIEW #{TOKEN}"]], {})
    assert [(a.kind, a.run_id) for a in gone.actions] == [("create_run", RUN)]
    failed = plan([[URL, f"NEEDS_REVIEW #{TOKEN}"]], {RUN: "failed"})
    assert [(a.kind, a.run_id) for a in failed.actions] == [("reset_run", RUN)]


def test_a_row_in_review_whose_run_succeeded_is_flagged_and_its_anchor_released() -> None:
    p = plan([[URL, f"NEEDS_REVIEW #{TOKEN}"]], {RUN: "success"})
    assert [(a.kind, a.reason) for a in p.actions] == [("flag", reconcile.SUCCESS_IN_REVIEW)]
    assert p.released == [TOKEN]


def test_a_row_in_review_whose_ledger_item_failed_is_failed_once_no_run_is_active() -> None:
    gave_up = {KEY: LedgerView(states.FAILED, False, "translate: quota exhausted", 3)}
    assert plan([[URL, f"NEEDS_REVIEW #{TOKEN}"]], {RUN: "running"}, gave_up).actions == []
    p = plan([[URL, f"NEEDS_REVIEW #{TOKEN}"]], {RUN: "failed"}, gave_up)
    assert kinds(p) == [("transition", Status.FAILED)]


@pytest.mark.parametrize("state", ["success", "failed", None])
def test_a_rejected_row_is_done_whatever_its_run(state: str | None) -> None:
    runs = {RUN: state} if state else {}
    p = plan([[URL, f"REJECTED #{TOKEN}", "reviewer: wrong terminology"]], runs)
    assert p.actions == [] and p.released == []


def test_a_rejected_row_abandons_its_pending_ledger_item_only() -> None:
    pending = {KEY: LedgerView(states.PENDING, False, "", 3)}
    p = plan([[URL, f"REJECTED #{TOKEN}"]], {}, pending)
    assert [(a.kind, a.reason) for a in p.actions] == [("ledger_abandon", reconcile.SHEET_REJECTED)]
    live = {KEY: LedgerView(states.LEASED, False, "", 3)}
    assert plan([[URL, f"REJECTED #{TOKEN}"]], {}, live).actions == [], "a live lease is never overruled"
