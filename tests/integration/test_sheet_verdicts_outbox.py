"""INVALID and DUPLICATE leave through the ledger's outbox, like every final status (issue 22).

A claim takes a bad NEW row (``PROCESSING #token`` and its anchor, in the claim's batch) and
writes nothing more: the wake-up commits the row's INVALID or DUPLICATE with its reason to the
outbox, then relays it, the row's anchor going in the batch of that final transition. The same
for ``sheet_reconcile``'s INVALID, DUPLICATE and FAILED, and for a claimer stepping aside
(``test_sheet_claim_ownership.py``). Proven against the Sheets emulator over HTTP and a real
ledger; the kills are SIGKILLs of real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.ledger import Ledger
from onceflow.ledger.db import create_ledger_engine
from onceflow.ledger.outbox import pending_sheet_rows
from onceflow.sheets import reconcile
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.relay import claim_work_key, send_rows
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.wakeup import CLAIM_STEP, wake_up
from onceflow.testing.sheet_edits import batch_update, set_row

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
#: a NEW good row, then three the claim refuses: two INVALID, one DUPLICATE of the first
BAD = [
    ["https://news.example.com/verdict-1", "NEW"],
    ["", "NEW"],
    ["news.example.com/no-scheme", "NEW"],
    [" https://NEWS.example.com/verdict-1#top", "NEW"],
]
#: the reasons of rows 3, 4 and 5
REASONS = [
    "empty URL",
    "URL must start with http:// or https://: 'news.example.com/no-scheme'",
    "duplicate of row 2 (https://news.example.com/verdict-1)",
]


def _queue(emulator: SheetsEmulator, sid: str) -> SheetQueue:
    return SheetQueue(GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid), spread=1)


def _rows(emulator: SheetsEmulator, sid: str) -> list[Any]:
    return Snapshot.from_values(emulator.values(sid, "queue")).rows


def _anchors(emulator: SheetsEmulator, sid: str) -> set[str]:
    return {
        str(m.value) for m in emulator.server.store.spreadsheets[sid].all_metadata() if m.key == CLAIM_KEY
    }


def _outbox(ledger: Ledger) -> list[tuple[str, str, str, str]]:
    """(work key, step, state, status) of every sheet-row write in the outbox, oldest first."""
    import sqlalchemy as sa

    from onceflow.ledger import schema

    o = schema.outbox.c
    stmt = (
        sa.select(o.work_key, o.step, o.state, o.payload).where(o.target_type == "sheet_row").order_by(o.id)
    )
    with ledger.engine.connect() as conn:
        found = conn.execute(stmt).all()
    return [(w, step, state, json.loads(p)["data"]["status"]) for w, step, state, p in found]


def test_a_claim_writes_no_final_status_its_invalid_and_duplicate_leave_through_the_outbox(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *BAD]})
    queue = _queue(sheets_emulator, sid)
    result = queue.claim(10)
    assert [c.row_number for c in result.claims] == [2]
    assert [(r.row_number, r.status, r.reason) for r in result.rejected] == [
        (3, Status.INVALID, REASONS[0]),
        (4, Status.INVALID, REASONS[1]),
        (5, Status.DUPLICATE, REASONS[2]),
    ]
    # the claim took the bad rows and wrote nothing final: that is the outbox's to carry
    rows = _rows(sheets_emulator, sid)
    assert [r.status for r in rows] == [Status.PROCESSING] * 4
    assert not any(r.get("reason") for r in rows)
    assert _anchors(sheets_emulator, sid) == {r.token for r in rows}

    sheets_emulator.request_log.reset()
    report = send_rows(queue, sqlite_ledger, CLAIM_STEP, _writes(queue, result.rejected))
    assert sorted(report.written) == sorted(r.token for r in result.rejected) and not report.errors
    # one relay pass for all three: the tab with its rows' anchors, their reasons, one
    # batchUpdate; and a read-back, for the row with an empty URL: no findReplace can guard an
    # empty cell in the batch, so whether the editor typed a URL in meanwhile is read after it
    assert sheets_emulator.request_log.counts == {
        "spreadsheets.get": 1,
        "values.batchUpdateByDataFilter": 1,
        "spreadsheets.batchUpdate": 1,
        "values.batchGet": 1,
    }
    rows = _rows(sheets_emulator, sid)
    assert [r.status_cell.raw for r in rows[1:]] == [f"{r.status.value} #{r.token}" for r in result.rejected]
    assert [r.get("reason") for r in rows[1:]] == [r.reason for r in result.rejected]
    assert _anchors(sheets_emulator, sid) == {result.claims[0].token}, "final rows keep no anchor"
    assert _outbox(sqlite_ledger) == [
        (claim_work_key(r.token), CLAIM_STEP, "relayed", r.status.value) for r in result.rejected
    ]


def _writes(queue: SheetQueue, rejected: list[Any]) -> list[Any]:
    from onceflow.sheets.wakeup import rejection_writes

    return rejection_writes(queue, rejected)


def test_a_wake_up_sends_the_verdicts_of_its_own_claim_in_the_same_task(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *BAD]})
    woke = wake_up(_queue(sheets_emulator, sid), sqlite_ledger, 10)
    assert len(woke.claim.claims) == 1 and sorted(woke.rejected.written) == sorted(
        r.token for r in woke.claim.rejected
    )
    assert [r.get("reason") for r in _rows(sheets_emulator, sid)[1:]] == REASONS
    assert pending_sheet_rows(sqlite_ledger) == []


def test_a_verdict_is_not_written_over_a_url_the_editor_fixed_before_it_reached_the_row(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *BAD[1:3]]})
    queue = _queue(sheets_emulator, sid)
    result = queue.claim(10)
    fixed = "https://news.example.com/fixed-by-the-editor"
    batch_update(anonymous_service(sheets_emulator.endpoint), sid, set_row(0, 1, [fixed]))
    report = send_rows(queue, sqlite_ledger, CLAIM_STEP, _writes(queue, result.rejected))
    first, second = result.rejected
    assert report.left == [first.token] and report.written == [second.token]
    rows = _rows(sheets_emulator, sid)
    # the fixed row stays claimed, anchored, for sheet_reconcile to run its article
    assert (rows[0].url, rows[0].status_cell.raw, rows[0].get("reason")) == (
        fixed,
        f"PROCESSING #{first.token}",
        "",
    )
    assert _anchors(sheets_emulator, sid) == {first.token}
    assert pending_sheet_rows(sqlite_ledger) == []


# A wake-up whose relay of its own verdicts never starts: killed after their commit.
KILLED_AFTER_COMMIT = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.sheets import relay
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
    from onceflow.sheets.wakeup import wake_up

    args = json.loads(sys.argv[1])

    def stop(*a, **k):
        pathlib.Path(args["marker"]).write_text("committed")
        time.sleep(600)

    relay.relay_sheet_rows = stop  # what send_rows calls after its commit
    ledger = Ledger(create_ledger_engine(args["ledger"]))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(args["endpoint"]), args["sid"]), spread=1)
    wake_up(queue, ledger, 10)
    """
)

# A wake-up killed inside the relay of its verdicts, after the sheet batch, before the marks.
KILLED_AFTER_RELAY_BATCH = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.sheets import relay
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
    from onceflow.sheets.wakeup import wake_up

    args = json.loads(sys.argv[1])
    outcome = relay.RowWrites.outcome

    def settle_then_stop(self):
        out = outcome(self)  # the sheet batch applied; the outbox rows are marked after this
        pathlib.Path(args["marker"]).write_text(json.dumps(out))
        time.sleep(600)

    relay.RowWrites.outcome = settle_then_stop
    ledger = Ledger(create_ledger_engine(args["ledger"]))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(args["endpoint"]), args["sid"]), spread=1)
    wake_up(queue, ledger, 10)
    """
)


@pytest.fixture
def pg_ledger(ledger_url: str) -> Iterator[Ledger]:
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def _run_until(script: str, args: dict[str, Any], marker: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(args)], env=dict(os.environ))
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child exited with {proc.returncode} before {marker.name}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the child never reached {marker.name}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_a_wake_up_killed_after_its_verdicts_commit_or_inside_their_relay_loses_and_repeats_nothing(
    sheets_emulator: SheetsEmulator, pg_ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *BAD]})
    args = {"ledger": ledger_url, "endpoint": sheets_emulator.endpoint, "sid": sid}
    target = f"{sid}/queue"

    # 1. killed between the commit and the relay: the rows wait, claimed, in the outbox
    _run_until(KILLED_AFTER_COMMIT, {**args, "marker": str(tmp_path / "c")}, tmp_path / "c")
    rows = _rows(sheets_emulator, sid)
    assert [r.status for r in rows] == [Status.PROCESSING] * 4 and not any(r.get("reason") for r in rows)
    waiting = {str(r.data["token"]): r.data["status"] for r in pending_sheet_rows(pg_ledger, target)}
    assert sorted(waiting.values()) == ["DUPLICATE", "INVALID", "INVALID"]
    # the next wake-up, with no NEW row left to claim, writes them
    woke = wake_up(_queue(sheets_emulator, sid), pg_ledger, 10)
    assert woke.claim.aimed == 0 and sorted(woke.relayed.written) == sorted(waiting)
    rows = _rows(sheets_emulator, sid)
    assert [r.status.value for r in rows[1:]] == ["INVALID", "INVALID", "DUPLICATE"]
    assert [r.get("reason") for r in rows[1:]] == REASONS
    assert _anchors(sheets_emulator, sid) == {rows[0].token}
    assert pending_sheet_rows(pg_ledger, target) == []

    # 2. killed inside the relay, after its sheet batch: the next pass writes nothing again
    more = [["", "NEW"], ["https://news.example.com/verdict-1", "NEW"]]
    service = anonymous_service(sheets_emulator.endpoint)
    service.spreadsheets().values().append(
        spreadsheetId=sid, range="queue", valueInputOption="RAW", body={"values": more}
    ).execute()
    _run_until(KILLED_AFTER_RELAY_BATCH, {**args, "marker": str(tmp_path / "r")}, tmp_path / "r")
    after_crash = _rows(sheets_emulator, sid)
    assert [r.status.value for r in after_crash[4:]] == ["INVALID", "DUPLICATE"]
    assert _anchors(sheets_emulator, sid) == {rows[0].token}, "removed with the final transition"
    assert len(pending_sheet_rows(pg_ledger, target)) == 2, "the killed relay marked nothing"
    sheets_emulator.request_log.reset()
    woke = wake_up(_queue(sheets_emulator, sid), pg_ledger, 10)
    assert woke.relayed.relayed == 2 and not woke.relayed.errors
    assert sheets_emulator.request_log.counts.get("values.batchUpdateByDataFilter", 0) == 0, "no field again"
    assert [(r.status_cell.raw, r.get("reason")) for r in _rows(sheets_emulator, sid)] == [
        (r.status_cell.raw, r.get("reason")) for r in after_crash
    ]
    assert pending_sheet_rows(pg_ledger, target) == []


def test_reconcile_sends_its_invalid_and_duplicate_through_the_outbox(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *BAD[:2]]})
    queue = _queue(sheets_emulator, sid)
    result = queue.claim(10)  # a claimer that died before sending its verdict: the row stays PROCESSING
    (left,) = result.rejected
    # a second row of the first one's URL, claimed too (two claimers kept one URL)
    good = result.claims[0]
    service = anonymous_service(sheets_emulator.endpoint)
    when, _, version = good.token.split("-")
    twin = f"PROCESSING #{when}-ffffffffff-{version}"  # a later claim than the good row's
    service.spreadsheets().values().append(
        spreadsheetId=sid, range="queue", valueInputOption="RAW", body={"values": [[good.url, twin]]}
    ).execute()
    now = datetime.now(timezone.utc) + timedelta(hours=2)
    plan = reconcile.plan(
        Snapshot.from_values(sheets_emulator.values(sid, "queue")),
        now=now,
        lease=timedelta(minutes=60),
        version="v1",
        run_state=lambda _run_id: "running",
        audit=[],
    )
    moves = {a.row.token: a.new_status for a in plan.of("transition")}
    assert moves == {left.token: Status.INVALID, twin.split("#")[1]: Status.DUPLICATE}
    entries = reconcile.apply(
        plan.actions,
        queue,
        now=now,
        create_run=lambda *_: "exists",
        send_rows=lambda writes: send_rows(queue, sqlite_ledger, reconcile.RECONCILE_STEP, writes),
    )
    assert sorted(e["claim_token"] for e in entries if e["action"] == "transition") == sorted(moves)
    statuses = {r.token: r.status for r in _rows(sheets_emulator, sid)}
    assert {t: statuses[t] for t in moves} == moves
    assert sorted(_outbox(sqlite_ledger)) == sorted(
        (claim_work_key(t), reconcile.RECONCILE_STEP, "relayed", s.value) for t, s in moves.items()
    )
    assert _anchors(sheets_emulator, sid) == {good.token}
