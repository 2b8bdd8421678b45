"""Later writes reach the claimed row through its row anchor, whatever the editor does meanwhile.

The editor's insert, delete or sort is made through a second real client at the exact moment the
queue is about to send its ``values.batchUpdateByDataFilter`` (after it located the row), so each
case is deterministic. A positional write under the same interleaving lands on the wrong row,
which shows the interleaving bites. Then 8 claimer threads claim and write while an editor thread
inserts, deletes and sorts rows, and every row must end with exactly its own values.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets import reconcile
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_edits import batch_update, delete_rows, insert_rows, sort_rows

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


class EditorBeforeWrite(GoogleSheetsTransport):
    """Lets the editor act once, just before the next value write is sent (by anchor or by A1)."""

    before_write: Callable[[], None] | None = None

    def _editor(self) -> None:
        if self.before_write is not None:
            action, self.before_write = self.before_write, None
            action()

    def write_by_filter(self, data: list[tuple[dict[str, Any], list[list[Any]]]]) -> dict[str, Any]:
        self._editor()
        return super().write_by_filter(data)

    def write_values(self, data: list[tuple[str, list[list[str]]]]) -> None:
        self._editor()
        super().write_values(data)


class EditorBeforeBatch(GoogleSheetsTransport):
    """Lets the editor act once, just before the next ``spreadsheets.batchUpdate`` is sent."""

    before_batch: Callable[[], None] | None = None

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.before_batch is not None:
            action, self.before_batch = self.before_batch, None
            action()
        return super().batch_update(requests)


def _expected(url: str) -> dict[str, str]:
    """The values this test writes for a URL: derived from the URL, so any misplacement shows."""
    key = row_key(normalise_url(url))
    return {
        "run_id": pipeline_run_id(key, "v1"),
        "score": f"0.{key[:6]}",
        "published_url": f"https://pub.example/{key}",
    }


def _rows(emulator: SheetsEmulator, sid: str) -> Snapshot:
    return Snapshot.from_values(emulator.values(sid, "queue"))


def _assert_rows_own_their_values(snapshot: Snapshot, written: set[str] | None = None) -> None:
    """Each row's onceflow cells are empty or exactly what was written for that row's own URL."""
    for row in snapshot.rows:
        mine = _expected(row.url) if row.url.startswith("https://") else {}
        cells = {k: row.get(k) for k in ("run_id", "score", "published_url")}
        if written is not None and row.url in written:
            assert cells == mine, f"row {row.number} ({row.url}) has {cells}"
        else:
            assert all(v in ("", mine.get(k)) for k, v in cells.items()), (
                f"row {row.number} ({row.url}) has {cells}"
            )


def _setup(emulator: SheetsEmulator, n: int = 6) -> tuple[SheetQueue, EditorBeforeWrite, Any, str]:
    urls = [f"https://a.example/{chr(97 + i)}" for i in range(n)]
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    transport = EditorBeforeWrite(anonymous_service(emulator.endpoint), sid)
    return SheetQueue(transport, spread=1), transport, anonymous_service(emulator.endpoint), sid


EDITS: dict[str, Callable[[int], list[dict[str, Any]]]] = {
    "insert above": lambda sheet_id: [insert_rows(sheet_id, 1, count=2)],
    "delete above": lambda sheet_id: [delete_rows(sheet_id, 1, 3)],
    "sort": lambda sheet_id: [sort_rows(sheet_id, descending=True)],
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_write_reaches_its_row_when_rows_move_between_locating_and_writing(
    sheets_emulator: SheetsEmulator, edit: str
) -> None:
    queue, transport, editor, sid = _setup(sheets_emulator)
    claim = next(c for c in queue.claim(6).claims if c.url.endswith("/d"))
    transport.before_write = lambda: batch_update(editor, sid, *EDITS[edit](queue.sheet_id()))
    transport.calls.clear()
    row = queue.write_fields(claim.token, _expected(claim.url))
    assert transport.before_write is None, "the editor acted between the locating read and the write"
    assert row.url == claim.url and row.token == claim.token
    assert dict(transport.calls) == {
        "values.batchGetByDataFilter": 1,
        "values.batchUpdateByDataFilter": 1,
    }
    snapshot = _rows(sheets_emulator, sid)
    assert claim.row_number != next(r.number for r in snapshot.rows if r.url == claim.url), "the row did move"
    _assert_rows_own_their_values(snapshot, written={claim.url})


def test_a_positional_write_under_the_same_interleaving_lands_on_the_wrong_row(
    sheets_emulator: SheetsEmulator,
) -> None:
    """Why anchors: the old locate-by-read-then-write-by-A1 put the values into another row."""
    queue, transport, editor, sid = _setup(sheets_emulator)
    claim = next(c for c in queue.claim(6).claims if c.url.endswith("/d"))
    located = queue.find(claim.token)
    assert located is not None
    transport.before_write = lambda: batch_update(editor, sid, *EDITS["sort"](queue.sheet_id()))
    transport.write_values([(f"queue!E{located.number}", [["0.5"]])])
    victim = next(r for r in _rows(sheets_emulator, sid).rows if r.get("score") == "0.5")
    assert victim.url != claim.url


def test_a_write_for_a_row_the_editor_deletes_meanwhile_lands_nowhere(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, transport, editor, sid = _setup(sheets_emulator)
    claim = next(c for c in queue.claim(6).claims if c.url.endswith("/d"))
    before = _rows(sheets_emulator, sid)
    index = next(r.number for r in before.rows if r.url == claim.url) - 1
    transport.before_write = lambda: batch_update(
        editor, sid, delete_rows(queue.sheet_id(), index, index + 1)
    )
    with pytest.raises(LookupError):
        queue.write_fields(claim.token, _expected(claim.url))
    after = _rows(sheets_emulator, sid)
    assert claim.url not in {r.url for r in after.rows}
    assert all(not r.get("score") and not r.get("run_id") and not r.get("published_url") for r in after.rows)


def test_reconcile_audits_a_repair_whose_row_was_deleted_and_writes_nothing_elsewhere(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, transport, editor, sid = _setup(sheets_emulator)
    claims = {c.url: c for c in queue.claim(6).claims}
    victim = claims["https://a.example/c"]
    wrong = _expected("https://a.example/f")["run_id"]  # another article's run id in this row
    row = queue.find(victim.token)
    assert row is not None
    editor.spreadsheets().values().update(
        spreadsheetId=sid, range=f"queue!D{row.number}", valueInputOption="RAW", body={"values": [[wrong]]}
    ).execute()
    now = datetime.now(timezone.utc)
    plan = reconcile.plan(
        queue.snapshot(),
        now=now,
        lease=timedelta(hours=1),
        version="v1",
        run_state=lambda _: "running",
        audit=[],
    )
    assert [(a.kind, a.row.url) for a in plan.actions] == [("rewrite", victim.url)]
    # the editor deletes the row after reconcile read it, before its write
    index = row.number - 1
    transport.before_write = lambda: batch_update(
        editor, sid, delete_rows(queue.sheet_id(), index, index + 1)
    )
    entries = reconcile.apply(plan.actions, queue, now=now, create_run=lambda *a: "created")
    assert [(e["action"], e["reason"], e["claim_token"]) for e in entries] == [
        ("skipped", reconcile.ROW_GONE, victim.token)
    ]
    audit = queue.read_audit()
    assert [(e["action"], e["reason"], e["url"]) for e in audit] == [
        ("skipped", reconcile.ROW_GONE, victim.url)
    ]
    after = _rows(sheets_emulator, sid)
    assert victim.url not in {r.url for r in after.rows}
    assert all(not r.get("run_id") for r in after.rows), "the repair was not written into another row"


PROCESS_CLAIMER = textwrap.dedent(
    """
    import random, sys
    from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
    from onceflow.sheets.model import Status
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.retry import Backoff
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

    endpoint, sid, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(endpoint), sid),
                       backoff=Backoff(base=0.05, cap=1.0, attempts=30), rng=random.Random(seed))
    while True:
        claims = queue.claim(4).claims
        if not claims and not any(r.status is Status.NEW for r in queue.snapshot().rows):
            break
        for c in claims:
            key = row_key(normalise_url(c.url))  # the same values as _expected() in the test
            queue.write_fields(c.token, {"run_id": pipeline_run_id(key, "v1"), "score": f"0.{key[:6]}",
                                         "published_url": f"https://pub.example/{key}"})
            print(c.url, flush=True)
    """
)


def _process_claimers(emulator: SheetsEmulator, sid: str, claimed: list[str]) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_CLAIMER, emulator.endpoint, sid, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            claimed.extend(line for line in out.splitlines() if line.strip())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_eight_claimers_write_their_rows_while_an_editor_inserts_deletes_and_sorts(
    sheets_emulator: SheetsEmulator, mode: str
) -> None:
    n = 96
    urls = [f"https://m.example/{i:03d}" for i in range(n)]
    rng = random.Random(3)
    rng.shuffle(urls)
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]}
    )
    sheet_id = GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid).sheet_ids()["queue"]
    stop = threading.Event()
    errors: list[BaseException] = []
    claimed: list[str] = []
    lock = threading.Lock()
    edits = [0]

    def editor() -> None:
        try:
            edit_rows()
        except BaseException as exc:  # reported below
            errors.append(exc)

    def edit_rows() -> None:
        svc = anonymous_service(sheets_emulator.endpoint)
        k = 0
        while not stop.is_set():
            at = 1 + k % 9
            # an editor row in the middle, a sort, then that row (found by its text) deleted again
            batch_update(svc, sid, insert_rows(sheet_id, at))
            svc.spreadsheets().values().update(
                spreadsheetId=sid,
                range=f"queue!A{at + 1}",
                valueInputOption="RAW",
                body={"values": [[f"editor {k}", "HOLD"]]},
            ).execute()
            batch_update(svc, sid, sort_rows(sheet_id, descending=k % 2 == 0))
            col = svc.spreadsheets().values().get(spreadsheetId=sid, range="queue!A:A").execute()["values"]
            where = next(i for i, v in enumerate(col) if v and v[0] == f"editor {k}")
            batch_update(svc, sid, delete_rows(sheet_id, where, where + 1))
            k += 1
            edits[0] = k

    def claimer(seed: int) -> None:
        try:
            queue = SheetQueue(
                GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid),
                rng=random.Random(seed),
            )
            while True:
                claims = queue.claim(4).claims
                if not claims and not _has_new(queue):
                    return
                for claim in claims:
                    queue.write_fields(claim.token, _expected(claim.url))
                    with lock:
                        claimed.append(claim.url)
        except BaseException as exc:  # reported below
            errors.append(exc)

    edit = threading.Thread(target=editor)
    edit.start()
    try:
        if mode == "processes":
            _process_claimers(sheets_emulator, sid, claimed)
        else:
            workers = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
    finally:
        stop.set()
        edit.join()
    assert not errors, errors
    assert edits[0] >= 2, "the editor really moved rows during the run"
    assert sorted(claimed) == sorted(urls), "every row claimed exactly once"
    final = _rows(sheets_emulator, sid)
    assert sorted(r.url for r in final.rows) == sorted(urls)
    _assert_rows_own_their_values(final, written=set(urls))
    # every anchor sits on the row carrying its token, and each claimed row has exactly one:
    # lost claims' anchors were all cleaned up
    with sheets_emulator.server.store.lock:
        metas = sheets_emulator.server.store.get(sid).all_metadata()
    anchored = sorted(
        (m.index + 1, m.value) for m in metas if m.key == "onceflow.claim" and m.index is not None
    )
    assert anchored == sorted((r.number, r.token) for r in final.rows)


def _has_new(queue: SheetQueue) -> bool:
    return any(r.status is not None and r.status.value == "NEW" for r in queue.snapshot().rows)


def _anchors(emulator: SheetsEmulator, sid: str, token: str) -> list[int]:
    """Rows (1-based) carrying an anchor for ``token``, straight from the emulator's state."""
    with emulator.server.store.lock:
        book = emulator.server.store.get(sid)
        return sorted(m.index + 1 for m in book.all_metadata() if m.value == token and m.index is not None)


def test_a_claim_made_before_anchors_is_adopted_on_its_first_write(sheets_emulator: SheetsEmulator) -> None:
    token = "20260101T000000Z-00000000aa"
    rows = [HEADER, ["https://a.example/a", "NEW"], ["https://a.example/b", f"PROCESSING #{token}"]]
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": rows})
    transport = EditorBeforeWrite(anonymous_service(sheets_emulator.endpoint), sid)
    queue = SheetQueue(transport, spread=1)
    assert _anchors(sheets_emulator, sid, token) == []
    queue.write_fields(token, _expected("https://a.example/b"))
    assert _anchors(sheets_emulator, sid, token) == [3]
    _assert_rows_own_their_values(_rows(sheets_emulator, sid), written={"https://a.example/b"})
    transport.calls.clear()
    queue.write_fields(token, {"score": "0.1"})
    assert dict(transport.calls) == {"values.batchGetByDataFilter": 1, "values.batchUpdateByDataFilter": 1}


def test_an_anchor_left_on_a_row_whose_cells_were_cut_and_pasted_elsewhere_is_dropped(
    sheets_emulator: SheetsEmulator,
) -> None:
    """Cut and paste moves values, not row metadata: the write must follow the token, not the anchor."""
    queue, _, editor, sid = _setup(sheets_emulator, n=3)
    claim = next(c for c in queue.claim(3).claims if c.url.endswith("/a"))
    snapshot = _rows(sheets_emulator, sid)
    a = next(r for r in snapshot.rows if r.url == claim.url)
    # the editor swaps rows a and c by pasting values (row metadata stays where it was)
    c = next(r for r in snapshot.rows if r.url.endswith("/c"))
    editor.spreadsheets().values().batchUpdate(
        spreadsheetId=sid,
        body={
            "valueInputOption": "RAW",
            "data": [
                {"range": f"queue!A{a.number}:B{a.number}", "values": [[c.url, c.status_cell.raw]]},
                {"range": f"queue!A{c.number}:B{c.number}", "values": [[a.url, a.status_cell.raw]]},
            ],
        },
    ).execute()
    queue.write_fields(claim.token, _expected(claim.url))
    assert _anchors(sheets_emulator, sid, claim.token) == [c.number], (
        "stray anchor dropped, token's row adopted"
    )
    _assert_rows_own_their_values(_rows(sheets_emulator, sid), written={claim.url})


def test_a_claim_batch_refused_because_rows_were_deleted_under_it_is_made_again(
    sheets_emulator: SheetsEmulator,
) -> None:
    """An anchor cannot be created past the end of the sheet: the batch is refused whole, nothing
    is applied, and the claim starts again from a fresh read."""
    urls = ["https://a.example/a", "https://a.example/b", "https://a.example/c"]
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]}
    )
    transport = EditorBeforeBatch(anonymous_service(sheets_emulator.endpoint), sid)
    queue = SheetQueue(transport, spread=1)
    editor = anonymous_service(sheets_emulator.endpoint)
    sheet_id = queue.sheet_id()
    batch_update(editor, sid, delete_rows(sheet_id, 4, 1000))  # the grid ends at row 4
    transport.before_batch = lambda: batch_update(editor, sid, delete_rows(sheet_id, 1, 2))
    result = queue.claim(3)
    assert transport.calls["spreadsheets.batchUpdate"] == 2, "the first claim batch was refused"
    assert sorted(c.url for c in result.claims) == urls[1:]
    for claim in result.claims:
        assert _anchors(sheets_emulator, sid, claim.token) == [claim.row_number]
