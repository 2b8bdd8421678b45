"""sheet_reconcile's plan for a claim's own version, two live rows of one URL and a claimed bad row.

Pure planning (no I/O): the sheet is a Snapshot, Airflow's runs are dictionaries.
tests/integration/test_sheet_claim_ownership.py carries the same cases out through the DAGs.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from onceflow.sheets import reconcile
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot, Status, new_token, token_version

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
CLAIMED = T0 - timedelta(hours=2)  # past the 30-minute lease
URL = "https://a.example/1"
KEY = row_key(normalise_url(URL))


def plan(rows: list[list[str]], runs: dict[str, str], claims: dict[str, str] | None = None) -> reconcile.Plan:
    return reconcile.plan(
        Snapshot.from_values([HEADER, *rows]),
        now=T0,
        lease=timedelta(minutes=30),
        version="v1",  # the reconciler's own param: only for tokens without a version
        run_state=runs.get,
        audit=[],
        run_claim=(claims or {}).get,
    )


def test_a_token_carries_the_version_it_was_claimed_under() -> None:
    assert token_version(new_token(T0, "0a1b2c3d4e", "v2")) == "v2"
    assert token_version(new_token(T0, "0a1b2c3d4e", "2026-12.rc-1")) == "2026-12.rc-1"
    assert token_version(new_token(T0, "0a1b2c3d4e")) is None
    assert token_version("20250101T000000Z-aa") is None


def test_a_v2_claim_is_checked_and_repaired_under_v2_whatever_the_reconciler_version() -> None:
    token = new_token(CLAIMED, "0a1b2c3d4e", "v2")
    v1, v2 = pipeline_run_id(KEY, "v1"), pipeline_run_id(KEY, "v2")
    assert plan([[URL, f"PROCESSING #{token}"]], {v2: "queued"}).actions == []
    missing = plan([[URL, f"PROCESSING #{token}"]], {})
    assert [(a.kind, a.run_id) for a in missing.actions] == [("create_run", v2)]
    assert v1 not in {a.run_id for a in missing.actions}


def test_an_old_token_without_a_version_takes_it_from_its_run_id_cell_else_the_param() -> None:
    old = "20260105T100000Z-aa"
    v3 = pipeline_run_id(KEY, "v3")
    from_cell = plan([[URL, f"PROCESSING #{old}", "", v3]], {})
    assert [(a.kind, a.run_id) for a in from_cell.actions] == [("create_run", v3)]
    default = plan([[URL, f"PROCESSING #{old}"]], {})
    assert [(a.kind, a.run_id) for a in default.actions] == [("create_run", pipeline_run_id(KEY, "v1"))]


def test_of_two_live_rows_of_one_url_the_row_whose_token_is_in_the_run_is_kept() -> None:
    earlier = new_token(CLAIMED, "aaaaaaaaaa", "v1")
    later = new_token(CLAIMED + timedelta(seconds=1), "bbbbbbbbbb", "v1")
    run = pipeline_run_id(KEY, "v1")
    rows = [[URL, f"PROCESSING #{later}"], [URL, f"PROCESSING #{earlier}"]]
    # the run carries the later claim (its claimer created the run first)
    p = plan(rows, {run: "queued"}, {run: later})
    assert [(a.kind, a.row.token, a.new_status) for a in p.actions] == [
        ("transition", earlier, Status.DUPLICATE)
    ]
    assert p.actions[0].fields == (("reason", f"duplicate of row 2 ({URL})"),)
    # without a run to say, the earliest claim keeps it
    q = plan(rows, {}, {})
    assert [(a.kind, a.row.token) for a in q.actions] == [
        ("transition", later),
        ("create_run", earlier),
    ]


def test_a_claimed_row_with_an_invalid_url_is_marked_invalid_with_its_reason_after_the_lease() -> None:
    token = new_token(CLAIMED, "0a1b2c3d4e", "v1")
    p = plan([["ftp://a.example/1", f"PROCESSING #{token}"]], {})
    why = "URL must start with http:// or https://: 'ftp://a.example/1'"
    assert [(a.kind, a.reason, a.new_status, a.fields) for a in p.actions] == [
        ("transition", reconcile.CLAIMED_INVALID.format(why=why), Status.INVALID, (("reason", why),))
    ]
    fresh = new_token(T0 - timedelta(minutes=5), "0a1b2c3d4e", "v1")
    assert plan([["ftp://a.example/1", f"PROCESSING #{fresh}"]], {}).actions == [], "its claimer may be at it"
