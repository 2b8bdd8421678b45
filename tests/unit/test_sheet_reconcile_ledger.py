"""sheet_reconcile's plan when it also sees the work ledger: one case per row of the truth table.

Pure planning (no I/O): the sheet is a Snapshot, Airflow's run states and the ledger items are
dictionaries. tests/integration/test_sheet_ledger.py carries the plans out on the Sheets emulator
and a real ledger.
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
FRESH = "20260105T115500Z-bb"  # five minutes before T0: within the lease
URL = "https://a.example/1"
KEY = row_key(normalise_url(URL))
RUN = pipeline_run_id(KEY, "v1")


def view(state: str, *, expired: bool = False, reason: str = "") -> LedgerView:
    return LedgerView(state, expired, reason, 3)


def plan(
    row: list[str],
    ledger: dict[str, LedgerView],
    runs: dict[str, str],
    audit: list[dict[str, str]] | None = None,
) -> reconcile.Plan:
    return reconcile.plan(
        Snapshot.from_values([HEADER, row]),
        now=T0,
        lease=timedelta(minutes=30),
        version="v1",
        run_state=runs.get,
        audit=audit or [],
        ledger=ledger.get,
    )


def kinds(p: reconcile.Plan) -> list[tuple[str, str]]:
    return [(a.kind, a.reason) for a in p.actions]


@pytest.mark.parametrize("token", [FRESH, OLD])
def test_a_claim_the_ledger_missed_is_registered_at_once_whatever_the_lease(token: str) -> None:
    p = plan([URL, f"PROCESSING #{token}"], {}, {RUN: "running"})
    assert kinds(p) == [("ledger_register", reconcile.LEDGER_MISSING)]


def test_needs_correction_turns_the_row_invalid_with_the_ledger_reason_once_no_run_is_active() -> None:
    ledger = {KEY: view("needs_correction", reason="page is not an article\nstack...")}
    p = plan([URL, f"PROCESSING #{FRESH}"], ledger, {RUN: "failed"})
    [action] = p.actions
    why = "page is not an article"
    assert (action.kind, action.new_status, action.fields) == (
        "transition",
        Status.INVALID,
        (("reason", why),),
    )
    assert action.reason == reconcile.LEDGER_INVALID.format(why=why)
    # while a run is active (a recheck, a re-drive), nothing is decided
    assert plan([URL, f"PROCESSING #{FRESH}"], ledger, {RUN: "running"}).actions == []


def test_a_ledger_that_gave_up_fails_the_row_instead_of_re_driving_it() -> None:
    ledger = {KEY: view("failed", reason="TimeoutError: fetch timed out")}
    p = plan([URL, f"PROCESSING #{OLD}"], ledger, {RUN: "failed"})
    assert [(a.kind, a.new_status) for a in p.actions] == [("transition", Status.FAILED)]
    assert "fetch timed out" in p.actions[0].reason
    assert not p.of("reset_run"), "the ledger's verdict replaces the re-drive"


def test_a_row_failed_in_the_sheet_abandons_its_pending_item_only() -> None:
    row = [URL, f"FAILED #{OLD}"]
    assert kinds(plan(row, {KEY: view("pending")}, {})) == [("ledger_abandon", reconcile.SHEET_GAVE_UP)]
    expired = view("leased", expired=True)
    assert kinds(plan(row, {KEY: expired}, {})) == [("ledger_abandon", reconcile.SHEET_GAVE_UP)]
    for state in ("done", "failed", "needs_correction", "leased"):
        assert plan(row, {KEY: view(state)}, {}).actions == [], state


def test_giving_up_after_re_drives_also_abandons_the_item_in_the_same_pass() -> None:
    redrive = {"action": "reset_run", "reason": reconcile.REDRIVE_FAILED, "claim_token": OLD, "url": URL}
    p = plan([URL, f"PROCESSING #{OLD}"], {KEY: view("pending")}, {RUN: "failed"}, [redrive] * 3)
    assert [a.kind for a in p.actions] == ["transition", "ledger_abandon"]


def test_a_done_row_with_a_link_records_the_result_the_ledger_missed() -> None:
    row = [URL, f"DONE #{OLD}", "", "", "", "https://pub.example/1"]
    assert kinds(plan(row, {KEY: view("pending")}, {})) == [("ledger_record_done", reconcile.SHEET_DONE)]
    assert kinds(plan(row, {KEY: view("leased", expired=True)}, {})) == [
        ("ledger_record_done", reconcile.SHEET_DONE)
    ]
    assert plan(row, {KEY: view("leased")}, {}).actions == [], "a live lease holder decides"
    assert plan(row, {KEY: view("done")}, {}).actions == []


def test_a_successful_run_without_a_ledger_result_is_flagged_once() -> None:
    p = plan([URL, f"PROCESSING #{FRESH}"], {KEY: view("pending")}, {RUN: "success"})
    assert kinds(p) == [("flag", reconcile.RUN_OK_LEDGER_NOT.format(state="pending"))]
    logged = [a.audit_entry(T0) for a in p.actions]
    assert plan([URL, f"PROCESSING #{FRESH}"], {KEY: view("pending")}, {RUN: "success"}, logged).actions == []


def test_agreeing_records_plan_nothing() -> None:
    assert plan([URL, f"PROCESSING #{FRESH}"], {KEY: view("leased")}, {RUN: "running"}).actions == []
    assert (
        plan([URL, f"DONE #{OLD}", "", "", "", "https://pub.example/1"], {KEY: view("done")}, {}).actions
        == []
    )
    assert plan([URL, "NEW"], {}, {}).actions == []


def test_without_a_ledger_the_plan_is_the_sheet_and_airflow_one() -> None:
    p = reconcile.plan(
        Snapshot.from_values([HEADER, [URL, f"PROCESSING #{OLD}"]]),
        now=T0,
        lease=timedelta(minutes=30),
        version="v1",
        run_state={}.get,
        audit=[],
    )
    assert [(a.kind, a.run_id) for a in p.actions] == [("create_run", RUN)]
