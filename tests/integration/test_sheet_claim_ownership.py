"""Which claim owns an article: the claim's own processing version, two claimers of one URL, and
claimed rows left behind by a claimer that died.

``sheet_claim`` and ``sheet_reconcile`` run with ``dag.test()`` against the Sheets emulator and the
session's real metadata database (runs are created through the Task SDK, as in production; no
scheduler executes them here). The two-claimer race is the interleaving of issue 10, made
deterministic: the second claimer and the editor act from inside the first claimer's claim
request, after its read and before its write reaches the emulator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets import reconcile
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot, Status, token_time
from onceflow.sheets.protocol import Claim, SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.validation import judge_url
from onceflow.sheets.wakeup import wake_up
from onceflow.testing.dag_runner import FIRST_STEP_ONLY, dag_runs
from onceflow.testing.sheet_edits import batch_update, delete_rows
from onceflow.testing.sheets_fixtures import CLAIMED_QUEUE_HEADER

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = CLAIMED_QUEUE_HEADER
LEASE_PASSED = {"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}


def _key(url: str) -> str:
    return row_key(normalise_url(url))


def _rows(sheets_emulator: SheetsEmulator, sid: str) -> list[Any]:
    return Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows


def _queue(sheets_emulator: SheetsEmulator, sid: str, **kwargs: Any) -> SheetQueue:
    return SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), **kwargs)


# -- defect 2: the version travels with the claim -----------------------------------------------


def test_reconcile_leaves_a_claim_made_under_v2_to_its_v2_run(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    url = f"https://{uuid.uuid4().hex[:8]}.example.com/a"
    queue_sheet([[url, "NEW"]])
    claimed = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v2"})
    assert claimed.state == "success", claimed.ti_states
    v1, v2 = pipeline_run_id(_key(url), "v1"), pipeline_run_id(_key(url), "v2")
    assert claimed.xcom("claim_rows")["runs"] == {v2: "created"}

    # the lease has passed; reconcile runs with its own default version, v1
    repaired = run_dag("sheet_reconcile", conf=LEASE_PASSED)
    assert repaired.state == "success", repaired.ti_states
    runs = dag_runs("article_pipeline")
    assert v1 not in runs, "reconcile started a second run of the article under its own version"
    assert runs[v2][0] == "queued"
    assert not [e for e in repaired.xcom("reconcile") if e["action"] in ("create_run", "reset_run")]


def test_reconcile_creates_the_missing_run_under_the_version_the_row_was_claimed_under(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    url = f"https://{uuid.uuid4().hex[:8]}.example.com/a"
    sid = queue_sheet([[url, "NEW"]])
    # a v2 claimer that stopped between the claim and the run: the claim is all there is
    (claim,) = _queue(sheets_emulator, sid, version="v2").claim(1).claims
    assert claim.run_id == pipeline_run_id(_key(url), "v2")

    repaired = run_dag("sheet_reconcile", conf=LEASE_PASSED)
    assert repaired.state == "success", repaired.ti_states
    created = [e["run_id"] for e in repaired.xcom("reconcile") if e["action"] == "create_run"]
    assert created == [claim.run_id]
    runs = dag_runs("article_pipeline")
    assert pipeline_run_id(_key(url), "v1") not in runs
    assert runs[claim.run_id][1]["processing_version"] == "v2"
    assert runs[claim.run_id][1]["claim_token"] == claim.token


# -- defect 3: two claimers keep one URL --------------------------------------------------------


def _the_race(
    sheets_emulator: SheetsEmulator,
    monkeypatch: pytest.MonkeyPatch,
    tag: str,
    between: Callable[[Claim], None],
) -> tuple[str, dict[str, Claim]]:
    """Issue 10's interleaving, deterministically.

    Claimer A reads rows 2 (invalid), 3, 4 (URL U, NEW) and 5 (U, NEW); then, before A's claim
    batch reaches the sheet, the editor deletes row 3, claimer B (one second later, so B's token
    sorts after A's) claims the new row 3 (A's row 4) and ``between`` runs (B creating its run);
    then A's batch lands on A's old row 5 and wins it: both claims hold U. Row 6 (HOLD, never
    claimed) keeps A's aimed positions inside the sheet after the deletion.

    :return: the spreadsheet id and B's claim (under ``"B"``), filled in when A's claim is sent.
    """
    url = f"https://{tag}.example.com/u"
    sid = sheets_emulator.create_spreadsheet(
        "articles",
        sheets={
            "queue": [
                HEADER,
                ["ftp://not-an-article.example/1", "NEW"],
                [f"https://{tag}.example.com/x", "NEW"],
                [url, "NEW"],
                [url, "NEW"],
                [f"https://{tag}.example.com/w", "HOLD"],
            ]
        },
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    original = GoogleSheetsTransport.batch_update
    seen: dict[str, Claim] = {}
    started: list[bool] = []  # B's own claim goes through this method too: act once only

    def first_claim_waits_for_b(self: GoogleSheetsTransport, requests: list[dict[str, Any]]) -> Any:
        tokens = [
            r["findReplace"]["replacement"].split("#", 1)[1]
            for r in requests
            if r.get("findReplace", {}).get("replacement", "").startswith("PROCESSING #")
        ]
        if tokens and not started:
            started.append(True)
            a_time = token_time(tokens[0])
            assert a_time is not None
            service = anonymous_service(sheets_emulator.endpoint)
            sheet_id = _queue(sheets_emulator, sid).sheet_id()
            batch_update(service, sid, delete_rows(sheet_id, 2, 3))  # the editor deletes row 3
            b = _queue(sheets_emulator, sid, spread=1, clock=lambda: a_time + timedelta(seconds=1))
            won = wake_up(b, None, 1).claim.claims  # B's bad row leaves as sheet_claim sends it
            assert [(c.url, c.row_number) for c in won] == [(url, 3)], won
            seen["B"] = won[0]
            # B's token is stamped a second after A's, so it can lie up to a second ahead of now:
            # wait it out, or a reconcile in between() sees B's lease (0 minutes) as not yet passed
            while datetime.now(timezone.utc) <= won[0].claimed_at:
                time.sleep(0.05)
            between(won[0])
        return original(self, requests)

    monkeypatch.setattr(GoogleSheetsTransport, "batch_update", first_claim_waits_for_b)
    return sid, seen


def test_the_claimer_whose_run_already_carries_another_claim_marks_its_own_row_duplicate(
    run_dag: Any, sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow.operators.sheets import ARTICLE_PIPELINE, create_dag_run

    tag = uuid.uuid4().hex[:8]

    def b_creates_its_run(claim: Claim) -> None:
        # B's own create_dag_run (sent from inside A's task, the only task running here)
        assert create_dag_run(ARTICLE_PIPELINE, claim.run_id, claim.conf(sid, "queue", "v1")) == "created"

    sid, seen = _the_race(sheets_emulator, monkeypatch, tag, b_creates_its_run)
    result = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert result.state == "success", result.ti_states
    b = seen["B"]
    out = result.xcom("claim_rows")
    ((a_token,),) = [[c["claim_token"] for c in out["claims"] if c["url"] == b.url]]
    assert a_token < b.token, "A kept U although B's claim was in its read-back"
    assert out["runs"] == {b.run_id: "exists"}
    assert out["duplicates"] == [
        {"claim_token": a_token, "owner_token": b.token, "reason": f"duplicate of row 3 ({b.url})"}
    ]
    rows = {r.token: r for r in _rows(sheets_emulator, sid) if r.token}
    assert rows[b.token].status is Status.PROCESSING
    assert rows[a_token].status is Status.DUPLICATE
    assert rows[a_token].get("reason") == f"duplicate of row 3 ({b.url})"
    assert dag_runs("article_pipeline")[b.run_id][1]["claim_token"] == b.token

    # reconcile agrees: the row the run works on stays, nothing is re-driven
    repaired = run_dag("sheet_reconcile", conf=LEASE_PASSED)
    assert repaired.state == "success", repaired.ti_states
    assert not [e for e in repaired.xcom("reconcile") if e["action"] in ("transition", "create_run")]
    assert {r.token: r.status for r in _rows(sheets_emulator, sid)}[b.token] is Status.PROCESSING


def test_reconcile_keeps_the_row_whose_claim_token_is_in_the_run(
    run_dag: Any, sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = uuid.uuid4().hex[:8]

    def reconcile_creates_b_run(claim: Claim) -> None:
        # B stopped before creating its run; a reconcile pass creates it from B's row
        first = run_dag("sheet_reconcile", conf=LEASE_PASSED)
        assert first.state == "success", first.ti_states
        assert [e["claim_token"] for e in first.xcom("reconcile") if e["action"] == "create_run"] == [
            claim.token
        ]

    sid, seen = _the_race(sheets_emulator, monkeypatch, tag, reconcile_creates_b_run)
    # claimer A, which then stopped before creating its run
    a = _queue(sheets_emulator, sid).claim(10)
    b = seen["B"]
    (a_claim,) = [c for c in a.claims if c.url == b.url]
    assert a_claim.token < b.token and a_claim.run_id == b.run_id

    second = run_dag("sheet_reconcile", conf=LEASE_PASSED)
    assert second.state == "success", second.ti_states
    moved = [(e["claim_token"], e["reason"]) for e in second.xcom("reconcile") if e["action"] == "transition"]
    assert moved == [(a_claim.token, reconcile.CLAIMED_TWICE.format(first=b.token))]
    rows = {r.token: r for r in _rows(sheets_emulator, sid) if r.token}
    assert rows[b.token].status is Status.PROCESSING, "the row the run works on was demoted"
    assert rows[a_claim.token].status is Status.DUPLICATE
    assert rows[a_claim.token].get("reason") == f"duplicate of row 3 ({b.url})"
    assert dag_runs("article_pipeline")[b.run_id][1]["claim_token"] == b.token


def test_a_recheck_works_on_the_row_that_owns_the_run_not_the_claim_the_item_was_registered_with(
    run_dag: Any, sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """B registers ``article:K`` with its claim and dies; A's registration changes nothing, A's run
    carries A's token; reconcile makes B's row DUPLICATE. The item's payload still names B's claim,
    and a recheck must work on A's row (before the fix it wrote its run id beside B's DUPLICATE)."""
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.ledger.recheck import RecheckRequest, start_recheck
    from onceflow.sheets import ledger_link

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER",
        json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}}),
    )
    ledger = Ledger(create_ledger_engine(url))
    tag = uuid.uuid4().hex[:8]

    def b_registers_then_dies(claim: Claim) -> None:
        # B's sheet_claim registered the article with its own claim, then died before its run
        record = ledger_link.ClaimRecord(
            claim.row_key, claim.row_number, claim.token, claim.conf(sid, "queue", "v1")
        )
        assert ledger_link.register_claims(ledger, [record]) == [ledger_link.work_key(claim.row_key)]

    sid, seen = _the_race(sheets_emulator, monkeypatch, tag, b_registers_then_dies)
    claimed = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})  # claimer A
    assert claimed.state == "success", claimed.ti_states
    b = seen["B"]
    key = ledger_link.work_key(b.row_key)
    assert claimed.xcom("claim_rows")["runs"][b.run_id] == "created"
    assert key not in claimed.xcom("claim_rows")["ledger_items_created"]
    a_conf = dag_runs("article_pipeline")[b.run_id][1]
    a_token = a_conf["claim_token"]
    assert a_token != b.token

    repaired = run_dag("sheet_reconcile", conf=LEASE_PASSED)  # keeps A's row: its token is in the run
    assert repaired.state == "success", repaired.ti_states
    assert {r.token: r.status for r in _rows(sheets_emulator, sid)}[b.token] is Status.DUPLICATE
    assert ledger.item(key).payload["claim_token"] == b.token, "the interleaving did not happen"

    # the owner's run does its step (dag.test runs it under a manual run id, with the run's conf)
    owner = run_dag("article_pipeline", conf=a_conf, mark_success_pattern=FIRST_STEP_ONLY)
    assert owner.state == "success", owner.ti_states
    assert ledger.item(key).state == "done"

    started = start_recheck(ledger, RecheckRequest("quality_sample", "weekly QA", "article"))
    assert started.work_keys == [key]
    # the conf RecheckDispatchOperator gives the run it creates in the recheck lane
    recheck_conf = {"work_key": key, "recheck_id": started.recheck_id, "reason": "weekly QA",
                    "target_version": "v1", "onceflow_lane": "recheck"}  # fmt: skip
    recheck = run_dag("article_pipeline_recheck", conf=recheck_conf, mark_success_pattern=FIRST_STEP_ONLY)
    assert recheck.state == "success", (recheck.ti_states, ledger.item(key))
    assert recheck.xcom("read_claimed_row")["claim_token"] == a_token
    rows = {r.token: r for r in _rows(sheets_emulator, sid) if r.token}
    assert rows[a_token].get("run_id") == recheck.run_id, "the recheck did not write to the owner row"
    assert rows[b.token].status is Status.DUPLICATE and not rows[b.token].get("run_id")
    assert ledger.item(key).state == "done"

    # the article's run was cleaned from Airflow's metadata (``airflow db clean``): the claim the
    # owner's step committed in the ledger still names the owner row
    _delete_run("article_pipeline", b.run_id)
    again = start_recheck(ledger, RecheckRequest("quality_sample", "QA after clean-up", "article"))
    assert again.work_keys == [key]
    second = run_dag(
        "article_pipeline_recheck",
        conf={**recheck_conf, "recheck_id": again.recheck_id},
        mark_success_pattern=FIRST_STEP_ONLY,
    )
    assert second.state == "success", (second.ti_states, ledger.item(key))
    assert second.xcom("read_claimed_row")["claim_token"] == a_token
    rows = {r.token: r for r in _rows(sheets_emulator, sid) if r.token}
    assert rows[a_token].get("run_id") == second.run_id
    assert not rows[b.token].get("run_id")
    ledger.engine.dispose()


def _delete_run(dag_id: str, run_id: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    assert run_id not in dag_runs(dag_id)


# -- defect 5: a claimed bad row left PROCESSING ---------------------------------------------------

CLAIMER_STOPPED_BEFORE_MARKING = textwrap.dedent(
    """
    import sys
    from onceflow.hooks.sheets import SheetQueueHook

    # the claim batch and its read-back are done; next the wake-up would commit the bad row's
    # INVALID to the outbox (onceflow.sheets.wakeup)
    SheetQueueHook().queue("v1").claim(5)
    print("CLAIMED", flush=True)
    sys.stdin.readline()  # the test kills us here
    raise SystemExit("not killed")
    """
)


def test_a_bad_row_left_processing_by_a_killed_claimer_is_marked_invalid_with_its_reason(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    good = f"https://{uuid.uuid4().hex[:8]}.example.com/a"
    sid = queue_sheet([["ftp://not-an-article.example/1", "NEW"], [good, "NEW"]])
    claimer = subprocess.Popen(
        [sys.executable, "-c", CLAIMER_STOPPED_BEFORE_MARKING],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert claimer.stdout is not None
    line = ""
    while not line.startswith("CLAIMED"):  # Airflow logs to stdout too
        line = claimer.stdout.readline()
        assert line, claimer.stderr.read() if claimer.stderr else "claimer exited before claiming"
    os.kill(claimer.pid, signal.SIGKILL)
    assert claimer.wait(timeout=30) == -signal.SIGKILL
    bad = _rows(sheets_emulator, sid)[0]
    assert bad.status is Status.PROCESSING and bad.token and not bad.get("reason")
    why = judge_url(bad).reason

    repaired = run_dag("sheet_reconcile", conf=LEASE_PASSED)
    assert repaired.state == "success", repaired.ti_states
    assert [
        (e["action"], e["reason"]) for e in repaired.xcom("reconcile") if e["claim_token"] == bad.token
    ] == [("transition", reconcile.CLAIMED_INVALID.format(why=why))]
    row = _rows(sheets_emulator, sid)[0]
    assert row.status_cell.raw == f"INVALID #{bad.token}"
    assert row.get("reason") == why
    again = run_dag("sheet_reconcile", conf=LEASE_PASSED)
    assert not [e for e in again.xcom("reconcile") if e["claim_token"] == bad.token]
