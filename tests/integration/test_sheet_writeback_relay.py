"""Write-backs through the ledger's outbox, relayed to the sheet in batches (issue 22).

``publish`` commits its result and the row's DONE (a ``sheet_row`` outbox row) in one ledger
transaction; :func:`onceflow.sheets.relay.relay_sheet_rows` writes every pending row of a sheet
in 1 read + 2 writes. Proven here:

* a process SIGKILLed at the step boundary after the commit (before any write-back) loses nothing:
  the relay writes the rows; a relaying process SIGKILLed after its sheet batch applied and before
  it marked the outbox rows repeats nothing (the next pass writes no field, leaves no anchor, and
  the sheet reads back the same);
* ten rows cost one pass of 1 ``spreadsheets.get`` + 1 read + 2 writes;
* an editor's URL typed in between the relay's read and its batch never ends DONE with the old
  link; the other rows of the batch are written;
* a try whose lease was taken over commits no write-back, so the sheet never sees it;
* Airflow's outbox relay leaves sheet rows to the sheet relay.

Real Sheets emulator over HTTP (google-api-python-client), real ledger (SQLite file and, with
``ONCEFLOW_TEST_DATABASE_URL``, PostgreSQL), real processes killed with SIGKILL. The step's work
is a stand-in (a fixed link and score): the point is the commit and what follows it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.hooks.sheets import SheetQueueHook
from onceflow.ledger import Ledger, StaleFenceError
from onceflow.ledger.db import create_ledger_engine
from onceflow.ledger.models import SHEET_ROW
from onceflow.ledger.outbox import OutboxRelay, pending_rows, pending_sheet_rows
from onceflow.ledger.steps import run_keyed_step
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.ledger_link import work_key
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.relay import relay_sheet_rows, row_write, sheet_target
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.clock import FakeClock
from onceflow.testing.sheet_edits import batch_update, set_row

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from onceflow.sheets.protocol import Claim
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]

# One relay pass over any number of rows of one sheet, from a fresh queue.
ONE_PASS = {
    "spreadsheets.get": 1,
    "values.batchUpdateByDataFilter": 1,
    "spreadsheets.batchUpdate": 1,
}

# Commits the publish step of each claim (result + the row's DONE, one transaction), then stands
# at the step boundary where the task would go on to write_back: the test kills it there.
PUBLISHER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.ledger.steps import run_keyed_step
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import row_write

    args = json.loads(sys.argv[1])
    ledger = Ledger(create_ledger_engine(args["ledger"]))
    for claim in args["claims"]:
        published = {"url": claim["link"], "score": 0.9}
        fields = {"score": "0.90", "published_url": claim["link"], "run_id": claim["run_id"]}
        write = row_write(args["target"], claim["token"], Status.DONE, fields, row_key=claim["row_key"])
        run_keyed_step(
            ledger, kind="article", work_key=claim["work_key"], step="publish", owner="publisher",
            worker_version="v1", work=lambda lease: published, follow_ups=lambda result: [write],
        )
    pathlib.Path(args["marker"]).write_text("publish.committed")
    time.sleep(600)
    """
)

# One relay pass that stops (and is killed) after its sheet batch was applied, before the outbox
# rows are marked relayed.
RELAYER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.sheets import relay
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

    args = json.loads(sys.argv[1])
    outcome = relay.RowWrites.outcome

    def settle_then_stop(self):
        out = outcome(self)  # the sheet batch applied; the outbox rows are marked after this
        pathlib.Path(args["marker"]).write_text(json.dumps([out[t] for t, *_ in self.items]))
        time.sleep(600)

    relay.RowWrites.outcome = settle_then_stop
    ledger = Ledger(create_ledger_engine(args["ledger"]))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(args["endpoint"]), args["sid"]))
    relay.relay_sheet_rows(ledger, lambda sid, tab: queue)
    """
)


@pytest.fixture
def relay_ledger(ledger_url: str) -> Iterator[Ledger]:
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def _claimed(emulator: SheetsEmulator, n: int) -> tuple[str, list[Claim]]:
    urls = [[f"https://news.example.com/relay-{i}", "NEW"] for i in range(n)]
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *urls]})
    claims = SheetQueueHook(spreadsheet_id=sid).queue("v1", spread=1).claim(n).claims
    assert len(claims) == n
    return sid, sorted(claims, key=lambda c: c.row_number)


def _queue(
    emulator: SheetsEmulator, sid: str, transport: type[GoogleSheetsTransport] = GoogleSheetsTransport
) -> SheetQueue:
    return SheetQueue(transport(anonymous_service(emulator.endpoint), sid))


def _link(claim: Claim) -> str:
    return f"http://127.0.0.1:8080/published/{claim.row_key}/v1/index.html"


def _publish(ledger: Ledger, target: str, claim: Claim) -> None:
    """The publish step's commit, in this process: result and the row's DONE together."""
    fields = {"score": "0.90", "published_url": _link(claim), "run_id": claim.run_id}
    write = row_write(target, claim.token, Status.DONE, fields, row_key=claim.row_key)
    run_keyed_step(
        ledger, kind="article", work_key=work_key(claim.row_key), step="publish", owner="publisher",
        worker_version="v1", work=lambda lease: {"url": _link(claim)}, follow_ups=lambda result: [write],
    )  # fmt: skip


def _rows(emulator: SheetsEmulator, sid: str) -> dict[str, dict[str, str]]:
    """Each claim token's row as stored (read from the emulator's store, not through the queue)."""
    snapshot = Snapshot.from_values(emulator.values(sid, "queue"))
    found: dict[str, dict[str, str]] = {}
    for row in snapshot.rows:
        if row.token:
            assert row.token not in found, f"{row.token} is on two rows"
            found[row.token] = {name: row.get(name) for name in HEADER}
    return found


def _anchors(emulator: SheetsEmulator, sid: str) -> list[str]:
    return [
        str(m.value) for m in emulator.server.store.spreadsheets[sid].all_metadata() if m.key == CLAIM_KEY
    ]


def _run_until(
    script: str, args: dict[str, Any], marker: Path, timeout: float = 60.0
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(args)], env=dict(os.environ))
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child exited with {proc.returncode} before {marker.name}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the child never reached {marker.name}")
        time.sleep(0.05)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_crash_after_publish_commit_is_repaired_by_the_relay_and_a_crashed_relay_repeats_nothing(
    sheets_emulator: SheetsEmulator, relay_ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    sid, claims = _claimed(sheets_emulator, 3)
    target = sheet_target(sid, "queue")
    spec = [
        {
            "token": c.token,
            "row_key": c.row_key,
            "work_key": work_key(c.row_key),
            "run_id": c.run_id,
            "link": _link(c),
        }
        for c in claims
    ]
    publisher = _run_until(
        PUBLISHER,
        {"ledger": ledger_url, "target": target, "claims": spec, "marker": str(tmp_path / "published")},
        tmp_path / "published",
    )
    _kill(publisher)  # at the boundary between publish and write_back
    rows = _rows(sheets_emulator, sid)
    assert all(rows[c.token]["status"] == f"PROCESSING #{c.token}" for c in claims), (
        "nothing is written inline"
    )
    assert sorted(r.data["token"] for r in pending_sheet_rows(relay_ledger)) == sorted(
        c.token for c in claims
    )

    sheets_emulator.request_log.reset()
    relayer = _run_until(
        RELAYER,
        {
            "ledger": ledger_url,
            "endpoint": sheets_emulator.endpoint,
            "sid": sid,
            "marker": str(tmp_path / "relayed"),
        },
        tmp_path / "relayed",
    )
    _kill(relayer)  # after the sheet batch applied, before the outbox rows were marked
    assert json.loads((tmp_path / "relayed").read_text()) == [True, True, True]
    assert dict(sheets_emulator.request_log.counts) == ONE_PASS, "three rows, one pass"
    after_crash = _rows(sheets_emulator, sid)
    for c in claims:
        row = after_crash[c.token]
        assert row["status"] == f"DONE #{c.token}" and row["url"] == c.url
        assert (row["published_url"], row["score"], row["run_id"]) == (_link(c), "0.90", c.run_id)
    assert _anchors(sheets_emulator, sid) == [], "final rows keep no anchor"
    assert len(pending_sheet_rows(relay_ledger)) == 3, "the killed relay marked nothing"

    sheets_emulator.request_log.reset()
    report = relay_sheet_rows(relay_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid))
    assert (report.relayed, sorted(report.written), report.left, report.errors) == (
        3, sorted(c.token for c in claims), [], [],
    )  # fmt: skip
    assert sheets_emulator.request_log.counts.get("values.batchUpdateByDataFilter", 0) == 0, "no field again"
    assert _rows(sheets_emulator, sid) == after_crash
    assert _anchors(sheets_emulator, sid) == [], "the repeat left no anchor at rest"
    assert pending_sheet_rows(relay_ledger) == []
    assert relay_sheet_rows(relay_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid)).relayed == 0


def test_ten_rows_are_written_in_one_read_and_two_writes(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, claims = _claimed(sheets_emulator, 10)
    target = sheet_target(sid, "queue")
    for claim in claims:
        _publish(sqlite_ledger, target, claim)
    sheets_emulator.request_log.reset()
    report = relay_sheet_rows(sqlite_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid))
    assert dict(sheets_emulator.request_log.counts) == ONE_PASS
    assert dict(report.requests) == ONE_PASS, "the report counts what the sheet saw"
    assert report.relayed == 10 and len(report.written) == 10
    rows = _rows(sheets_emulator, sid)
    assert {t: (r["status"], r["url"], r["published_url"]) for t, r in rows.items()} == {
        c.token: (f"DONE #{c.token}", c.url, _link(c)) for c in claims
    }
    assert _anchors(sheets_emulator, sid) == []


class _EditBeforeDone(GoogleSheetsTransport):
    """The editor types a new URL into row 3 just before the batch that moves rows to DONE."""

    edit: Any = None

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        moves = [str(r.get("findReplace", {}).get("replacement", "")) for r in requests]
        if type(self).edit and any(m.startswith("DONE #") for m in moves):
            edit, type(self).edit = type(self).edit, None
            edit()
        return super().batch_update(requests)


def test_a_url_typed_in_during_the_relay_is_not_left_done_and_the_rest_of_the_batch_is_written(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, claims = _claimed(sheets_emulator, 3)
    target = sheet_target(sid, "queue")
    for claim in claims:
        _publish(sqlite_ledger, target, claim)
    edited = claims[1]
    new_url = "https://news.example.com/typed-during-the-relay"
    editor = anonymous_service(sheets_emulator.endpoint)
    _EditBeforeDone.edit = lambda: batch_update(editor, sid, set_row(0, edited.row_number - 1, [new_url]))
    report = relay_sheet_rows(sqlite_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid, _EditBeforeDone))
    assert _EditBeforeDone.edit is None, "the edit was made"
    assert report.left == [edited.token] and sorted(report.written) == sorted(
        c.token for c in claims if c is not edited
    )
    rows = _rows(sheets_emulator, sid)
    row = rows[edited.token]
    assert row["url"] == new_url
    assert row["status"] == f"PROCESSING #{edited.token}", "back in flight for its new URL"
    assert row["published_url"] == "", "never the old article's link beside the new URL"
    for c in claims:
        if c is not edited:
            assert (rows[c.token]["status"], rows[c.token]["published_url"]) == (f"DONE #{c.token}", _link(c))
    assert _anchors(sheets_emulator, sid) == [edited.token], "the row in flight keeps an anchor"
    assert pending_sheet_rows(sqlite_ledger) == [], "settled: sheet_reconcile runs the new URL"


def test_a_try_whose_lease_was_taken_over_commits_no_write_back(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, [claim] = _claimed(sheets_emulator, 1)
    target = sheet_target(sid, "queue")
    key = work_key(claim.row_key)

    def paused_past_its_lease(lease: Any) -> dict[str, str]:
        later = Ledger(
            sqlite_ledger.engine, clock=FakeClock(start=sqlite_ledger.clock.now() + 3600), migrate=False
        )
        later.lease_key("article", key, "newer-try", 600, "v1", reopen_reason="-")
        return {"url": "http://127.0.0.1/stale"}

    write = row_write(target, claim.token, Status.DONE, {"published_url": "http://127.0.0.1/stale"})
    with pytest.raises(StaleFenceError):
        run_keyed_step(
            sqlite_ledger, kind="article", work_key=key, step="publish", owner="old-try", worker_version="v1",
            work=paused_past_its_lease, follow_ups=lambda result: [write], lease_seconds=60,
        )  # fmt: skip
    assert pending_sheet_rows(sqlite_ledger) == []
    assert relay_sheet_rows(sqlite_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid)).relayed == 0
    assert _rows(sheets_emulator, sid)[claim.token]["status"] == f"PROCESSING #{claim.token}"


class _NoSink:
    def trigger_dag_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> bool:
        raise AssertionError(f"Airflow's relay took a sheet row as a run: {dag_id} {run_id}")

    def emit_asset_event(self, uri: str, extra: dict[str, Any]) -> bool:
        raise AssertionError(f"Airflow's relay took a sheet row as an event: {uri}")


def test_airflows_outbox_relay_leaves_sheet_rows_to_the_sheet_relay(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid, [claim] = _claimed(sheets_emulator, 1)
    _publish(sqlite_ledger, sheet_target(sid, "queue"), claim)
    report = OutboxRelay(sqlite_ledger, _NoSink()).relay_once()
    assert (report.relayed, report.errors) == (0, [])
    [row] = pending_rows(sqlite_ledger)
    assert row.target_type == SHEET_ROW and row.data["token"] == claim.token


def test_a_status_batch_that_failed_unapplied_leaves_its_write_backs_pending_for_the_next_pass(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """A 500 on the relay's status batch, not applied: the rows still wait in PROCESSING. The
    outbox rows used to be marked relayed ("not in a state to move"), and nothing wrote those
    rows again (the fault schedules found it: seeds 14, 98, 166, 189 of 0-199)."""
    sid, claims = _claimed(sheets_emulator, 2)
    target = sheet_target(sid, "queue")
    for claim in claims:
        _publish(sqlite_ledger, target, claim)
    sheets_emulator.faults.add("500", count=1, methods=["spreadsheets.batchUpdate"])
    report = relay_sheet_rows(sqlite_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid))
    assert (report.relayed, report.written, report.left) == (0, [], [])
    assert sorted(report.waiting) == sorted(c.token for c in claims) and report.errors
    assert all(r["status"].startswith("PROCESSING #") for r in _rows(sheets_emulator, sid).values())
    assert len(pending_sheet_rows(sqlite_ledger)) == 2, "kept for the next pass"

    report = relay_sheet_rows(sqlite_ledger, lambda _sid, _tab: _queue(sheets_emulator, sid))
    assert (report.relayed, sorted(report.written), report.errors) == (2, sorted(c.token for c in claims), [])
    rows = _rows(sheets_emulator, sid)
    assert {rows[c.token]["status"] for c in claims} == {f"DONE #{c.token}" for c in claims}
    assert _anchors(sheets_emulator, sid) == []
