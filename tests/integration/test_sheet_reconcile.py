"""sheet_claim, article_pipeline and sheet_reconcile with ``dag.test()`` against the Sheets emulator.

Runs are created through the Task SDK (``TriggerDagRun`` to the supervisor, then the Execution API)
into the session's real metadata database; ``dag.test()`` does not execute the runs it creates
(no scheduler here; ``tests/acceptance/test_sheet_claim_cluster.py`` does that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.hooks.ledger import LedgerHook
from onceflow.sheets import ledger_link, reconcile
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import AUDIT_HEADER, SheetQueue
from onceflow.sheets.retry import Backoff, RetriesExhausted, ServerError
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.dag_runner import FIRST_STEP_ONLY, dag_runs
from onceflow.testing.sheets_fixtures import CLAIMED_QUEUE_HEADER

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = CLAIMED_QUEUE_HEADER


def _run_id(url: str) -> str:
    return pipeline_run_id(row_key(normalise_url(url)), "v1")


def _urls(tag: str, n: int) -> list[str]:
    return [f"https://{tag}.example.com/a/{i}" for i in range(n)]


def test_sheet_claim_claims_first_then_creates_one_run_per_row(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    urls = _urls(uuid.uuid4().hex[:8], 4)
    sid = queue_sheet([[u, "NEW"] for u in urls] + [["", "NEW"]])
    result = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert result.state == "success", result.ti_states
    out = result.xcom("claim_rows")
    assert out["runs"] == {_run_id(u): "created" for u in urls}
    assert [r["status"] for r in out["rejected"]] == ["INVALID"]
    runs = dag_runs("article_pipeline")
    for claim in out["claims"]:
        state, conf = runs[claim["run_id"]]
        assert state == "queued" and conf["claim_token"] == claim["claim_token"]

    # the editor puts one row back to NEW: it is claimed again, and the existing run is accepted
    rows = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows
    again = rows[0]
    service = anonymous_service(sheets_emulator.endpoint)
    service.spreadsheets().values().update(
        spreadsheetId=sid, range=f"queue!B{again.number}", valueInputOption="RAW", body={"values": [["NEW"]]}
    ).execute()
    second = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert second.state == "success", second.ti_states
    assert second.xcom("claim_rows")["runs"] == {_run_id(again.url): "exists"}
    assert sum(1 for run_id in dag_runs("article_pipeline") if run_id == _run_id(again.url)) == 1


def test_article_pipeline_reads_its_row_back_by_token_wherever_it_moved(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    urls = _urls(uuid.uuid4().hex[:8], 3)
    sid = queue_sheet([[u, "NEW"] for u in urls])
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    claim = queue.claim(1).claims[0]
    # the editor inserts two rows above the claimed one
    service = anonymous_service(sheets_emulator.endpoint)
    sheet_id = queue.sheet_id()
    insert = {
        "insertDimension": {
            "range": {"sheetId": sheet_id, "dimension": "ROWS", "startIndex": 1, "endIndex": 3}
        }
    }
    service.spreadsheets().batchUpdate(spreadsheetId=sid, body={"requests": [insert]}).execute()
    log = sheets_emulator.request_log
    log.reset()
    result = run_dag(
        "article_pipeline", conf=claim.conf(sid, "queue", "v1"), mark_success_pattern=FIRST_STEP_ONLY
    )
    assert result.state == "success", result.ti_states
    # the same-article check rides on write_fields' own read: 1 read + 1 write per article
    assert (log.reads, log.writes) == (1, 1), log.counts
    assert result.xcom("read_claimed_row")["url"] == claim.url
    row = queue.find(claim.token)
    assert row is not None and row.number == claim.row_number + 2
    assert row.get("run_id") == result.run_id and row.get("claim_token") == claim.token
    assert row.get("claimed_at").startswith(claim.claimed_at.isoformat()[:16])
    assert row.status is Status.PROCESSING, "the article chain (a later issue) is what finishes the row"


KILLED_CLAIMER = textwrap.dedent(
    """
    import sys
    from onceflow.hooks.sheets import SheetQueueHook

    result = SheetQueueHook().queue("v1").claim(int(sys.argv[1]))
    print("TOKENS", *[c.token for c in result.claims], flush=True)
    sys.stdin.readline()  # about to create the runs: the test kills us here
    raise SystemExit("not killed")
    """
)


def test_a_claimer_killed_between_claim_and_run_creation_is_repaired_with_exactly_one_run(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    urls = _urls(uuid.uuid4().hex[:8], 3)
    sid = queue_sheet([[u, "NEW"] for u in urls])
    claimer = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLAIMER, "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert claimer.stdout is not None
    line = ""
    while not line.startswith("TOKENS"):  # Airflow logs to stdout too
        line = claimer.stdout.readline()
        assert line, "claimer exited before claiming"
    tokens = line.split()[1:]
    os.kill(claimer.pid, signal.SIGKILL)
    assert claimer.wait(timeout=30) == -signal.SIGKILL
    assert len(tokens) == 2, claimer.stderr.read() if claimer.stderr else ""
    rows = {r.token: r for r in Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows if r.token}
    orphan_runs = {_run_id(rows[t].url) for t in tokens}
    assert not orphan_runs & set(dag_runs("article_pipeline")), "no run exists for the orphaned claims yet"

    # within the lease no run is created, but the claims the ledger missed are registered at once
    # (registering is idempotent, so it cannot race the claimer); past it, the missing runs are
    # created once
    fresh = run_dag(
        "sheet_reconcile", conf={"lease_minutes": 60, "processing_version": "v1", "max_redrives": 3}
    )
    assert fresh.state == "success"
    assert sorted((e["action"], e["claim_token"]) for e in fresh.xcom("reconcile")) == sorted(
        ("ledger_register", t) for t in tokens
    )
    ledger = LedgerHook().get_ledger()
    for token in tokens:
        key = ledger_link.work_key(row_key(normalise_url(rows[token].url)))
        assert ledger.item(key).state == "pending"
        assert [(h.event, h.actor) for h in ledger.history(key)] == [("create", "reconciler")]
        assert ledger.item(key).payload["claim_token"] == token
    params = {"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}
    first = run_dag("sheet_reconcile", conf=params)
    assert first.state == "success", first.ti_states
    assert sorted(e["run_id"] for e in first.xcom("reconcile")) == sorted(orphan_runs)
    second = run_dag("sheet_reconcile", conf=params)
    assert second.state == "success" and second.xcom("reconcile") == [], "a queued run is left alone"
    runs = dag_runs("article_pipeline")
    for token in tokens:
        run_id = _run_id(rows[token].url)
        assert [r for r in runs if r == run_id] == [run_id]
        assert runs[run_id][1]["claim_token"] == token
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid))
    audit = queue.read_audit()
    assert sorted((e["action"], e["claim_token"]) for e in audit) == sorted(
        [("ledger_register", t) for t in tokens] + [("create_run", t) for t in tokens]
    )
    assert {e["reason"] for e in audit} == {reconcile.REDRIVE_MISSING, reconcile.LEDGER_MISSING}
    assert all(e["time"] for e in audit)


def test_reconcile_flags_done_without_link_and_link_without_done_once(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    tag = uuid.uuid4().hex[:8]
    sid = queue_sheet(
        [
            [f"https://{tag}.example/1", "DONE #20250101T000000Z-aa", "", "", "", ""],
            [f"https://{tag}.example/2", "HOLD", "", "", "", f"https://pub.example/{tag}/2"],
            [
                f"https://{tag}.example/3",
                "DONE #20250101T000000Z-bb",
                "",
                "",
                "7",
                f"https://pub.example/{tag}/3",
            ],
            ["ftp://x.example/4", "INVALID #20250101T000000Z-cc"],
        ]
    )
    params = {"lease_minutes": 60, "processing_version": "v1", "max_redrives": 3}
    first = run_dag("sheet_reconcile", conf=params)
    assert first.state == "success", first.ti_states
    flagged = {(e["url"], e["action"], e["reason"]) for e in first.xcom("reconcile")}
    assert flagged == {
        (f"https://{tag}.example/1", "flag", reconcile.DONE_NO_LINK),
        (f"https://{tag}.example/2", "flag", reconcile.LINK_NOT_DONE),
        ("ftp://x.example/4", "rewrite", reconcile.REASON_MISSING),
    }
    assert run_dag("sheet_reconcile", conf=params).xcom("reconcile") == []
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid))
    assert len(queue.read_audit()) == 3
    rows = queue.snapshot().rows
    assert rows[1].status_cell.raw == "HOLD", "flags change nothing in the row"
    assert rows[3].get("reason") == "URL must start with http:// or https://: 'ftp://x.example/4'"


def test_reconcile_audits_the_repairs_it_made_before_a_later_one_failed(
    sheets_emulator: SheetsEmulator,
) -> None:
    urls = _urls(uuid.uuid4().hex[:8], 3)
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]], "audit": [AUDIT_HEADER]}
    )
    transport = GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid)
    queue = SheetQueue(transport, spread=1, backoff=Backoff(attempts=2, base=0.01))
    claims = queue.claim(3).claims
    rows = {r.token: r for r in queue.snapshot().rows}
    redriven, flagged, rewritten = (rows[c.token] for c in claims)
    actions = [
        reconcile.Action("reset_run", reconcile.REDRIVE_FAILED, redriven, claims[0].run_id),
        reconcile.Action("flag", reconcile.SUCCESS_NOT_DONE, flagged, claims[1].run_id),
        reconcile.Action(
            "rewrite", reconcile.RUN_ID_WRONG_ROW, rewritten, claims[2].run_id, fields=(("run_id", "x"),)
        ),
    ]
    created: list[str] = []

    def create_run(run_id: str, conf: dict[str, str], reset: bool) -> str:
        created.append(run_id)
        return "created"

    # the Sheets API fails the third repair's read with 5xx (after its retries); appends still work
    sheets_emulator.faults.add("500", methods=["values.batchGetByDataFilter"])
    with pytest.raises((ServerError, RetriesExhausted)):
        reconcile.apply(actions, queue, now=datetime.now(timezone.utc), create_run=create_run)
    sheets_emulator.faults.clear()

    assert created == [claims[0].run_id]
    audit = queue.read_audit()
    assert [(e["action"], e["claim_token"]) for e in audit] == [
        ("reset_run", redriven.token),
        ("flag", flagged.token),
    ], "the actions done before the failure are audited; the failed one is not"
    still = queue.find(rewritten.token or "")
    assert still is not None and still.get("run_id") != "x"
    # the re-drive counts: with max_redrives=1 the next pass gives the row up instead of re-driving
    again = reconcile.plan(
        queue.snapshot(),
        now=datetime.now(timezone.utc),
        lease=timedelta(0),
        version="v1",
        run_state={claims[0].run_id: "failed"}.get,
        audit=audit,
        max_redrives=1,
    )
    assert [a.row.token for a in again.of("transition")] == [redriven.token]
    assert not again.of("reset_run")


def _entry(i: int) -> list[str]:
    return [
        f"2026-01-0{i}T00:00:00+00:00",
        "reset_run",
        reconcile.REDRIVE_FAILED,
        "k",
        "https://x.example/1",
        "t1",
        "r1",
    ]


@pytest.mark.parametrize(
    "tab",
    [
        pytest.param([_entry(1), _entry(2), _entry(3)], id="header-missing"),
        pytest.param([_entry(1), AUDIT_HEADER, _entry(2), [], _entry(3)], id="header-in-the-middle"),
        pytest.param([AUDIT_HEADER, _entry(1), _entry(2), _entry(3)], id="header-first"),
    ],
)
def test_read_audit_keys_columns_by_the_known_order_wherever_the_header_is(
    sheets_emulator: SheetsEmulator, tab: list[list[str]]
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER], "audit": tab})
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid))
    audit = queue.read_audit()
    assert audit == [dict(zip(AUDIT_HEADER, _entry(i), strict=True)) for i in (1, 2, 3)]
    # so re-drives are counted: three re-drives of the claim t1
    row = Snapshot.from_values([HEADER, ["https://x.example/1", "PROCESSING #t1"]]).rows[0]
    assert reconcile._already_logged(audit, reconcile.Action("reset_run", reconcile.REDRIVE_FAILED, row)) == 3


def test_reconcile_re_drives_a_run_that_failed_in_the_metadata_db(
    run_dag: Any, queue_sheet: Any, sheets_emulator: SheetsEmulator
) -> None:
    # The run states come from the Task SDK as its DagRunState enum, whose str() is
    # "DagRunState.FAILED": compared as such, no state matched and a failed run was never
    # re-driven or given up on (nor a succeeded one flagged). The plan tests pass plain strings,
    # so only the DAG shows it.
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import update

    (url,) = _urls(uuid.uuid4().hex[:8], 1)
    queue_sheet([[url, "NEW"]])
    claimed = run_dag("sheet_claim", conf={"max_rows": 1, "processing_version": "v1"})
    assert claimed.state == "success", claimed.ti_states
    ((token, run_id),) = [(c["claim_token"], c["run_id"]) for c in claimed.xcom("claim_rows")["claims"]]
    # dag.test() does not execute the runs it creates: the run's failure is set in the metadata
    # DB, as the scheduler would record it
    with create_session() as session:
        session.execute(
            update(DagRun)
            .where(DagRun.dag_id == "article_pipeline", DagRun.run_id == run_id)
            .values(state=DagRunState.FAILED)
        )
    repaired = run_dag(
        "sheet_reconcile", conf={"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}
    )
    assert repaired.state == "success", repaired.ti_states
    assert [(e["action"], e["claim_token"], e["run_id"]) for e in repaired.xcom("reconcile")] == [
        ("reset_run", token, run_id)
    ]
    assert dag_runs("article_pipeline")[run_id][0] == "queued", "the failed run was not cleared"


def test_a_re_drive_whose_audit_append_was_resent_counts_once(sheets_emulator: SheetsEmulator) -> None:
    # httplib2 resends a request whose connection closed before any reply (whatever num_retries
    # says): a values.append applied, then dropped, is appended twice. Re-drives are counted from
    # the audit tab, so one re-drive counted as two and the row was given up on early.
    (url,) = _urls(uuid.uuid4().hex[:8], 1)
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, [url, "NEW"]], "audit": [AUDIT_HEADER]}
    )
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    (claim,) = queue.claim(1).claims
    row = queue.find(claim.token)
    assert row is not None
    redrive = reconcile.Action("reset_run", reconcile.REDRIVE_FAILED, row, claim.run_id)
    queue.sheet_id(queue.audit_sheet)  # the tab ids first, so the fault hits the append
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["values.append"])
    reconcile.apply([redrive], queue, now=datetime.now(timezone.utc), create_run=lambda *_: "created")
    assert sheets_emulator.request_log["values.append"] == 2, (
        "httplib2 did not resend: the test proves nothing"
    )
    audit = queue.read_audit()
    assert [e["action"] for e in audit] == ["reset_run", "reset_run"], "the resent copy was appended too"
    assert reconcile._already_logged(audit, redrive) == 1
    # so with max_redrives=2 the next pass re-drives once more instead of giving the row up
    again = reconcile.plan(
        queue.snapshot(),
        now=datetime.now(timezone.utc),
        lease=timedelta(0),
        version="v1",
        run_state={claim.run_id: "failed"}.get,
        audit=audit,
        max_redrives=2,
    )
    assert [a.kind for a in again.actions] == ["reset_run"]
