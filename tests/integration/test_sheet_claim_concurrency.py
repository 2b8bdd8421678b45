"""Eight claimers race over 1,000 NEW rows: every row is claimed exactly once.

The claimers are real google-api-python-client clients talking HTTP to the Sheets emulator, as
threads of this process and as separate processes; then the same with injected 429s and
"apply then fail" (the write lands, the client sees a 500), and while an editor inserts, deletes
(claimed rows too) and sorts rows under them while the claimers finish what they win, with
Google's developer metadata cap enforced (the emulator's default).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets.keys import normalise_url, row_key
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.retry import Backoff
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_edits import batch_update, delete_rows, insert_rows, set_row, sort_rows
from onceflow.testing.sheet_races import drain, published_url, run_claimers

if TYPE_CHECKING:
    from collections.abc import Iterable

    from onceflow.sheets.protocol import ClaimResult
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
CLAIMERS = 8
ROWS = 1000
LIMIT = 40


def _seed(emulator: SheetsEmulator, rows: int = ROWS) -> str:
    data = [HEADER] + [[f"https://news.example.com/story/{i}", "NEW"] for i in range(rows)]
    return emulator.create_spreadsheet("articles", sheets={"queue": data})


def _queue(emulator: SheetsEmulator, sid: str, seed: int) -> SheetQueue:
    transport = GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)
    return SheetQueue(transport, backoff=Backoff(base=0.05, cap=1.0, attempts=30), rng=random.Random(seed))


def _records(results: Iterable[ClaimResult]) -> list[dict[str, Any]]:
    """Each claim won (token, row key), and each round's counts and the requests it sent."""
    records: list[dict[str, Any]] = []
    for result in results:
        records += [{"token": c.token, "row_key": c.row_key} for c in result.claims]
        records.append(
            {
                "redirected": result.redirected,
                "recovered": result.recovered,
                "aimed": result.aimed,
                "lost": result.lost,
                "won": len(result.claims),
                "requests": dict(result.requests),
            }
        )
    return records


def _claim_with_threads(emulator: SheetsEmulator, sid: str, finish: bool = False) -> list[dict[str, Any]]:
    queues = [_queue(emulator, sid, i) for i in range(CLAIMERS)]
    results = run_claimers(queues, LIMIT, timeout=600, finish=finish)
    records = [r for per_claimer in results for r in _records(per_claimer)]
    # what each claimer's transport sent, all told (claims, finishing, tab ids)
    records += [{"sent": dict(q.transport.calls)} for q in queues]
    return records


PROCESS_CLAIMER = textwrap.dedent(
    """
    import json, random, sys, time
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.retry import Backoff
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
    from onceflow.testing.sheet_races import drain

    endpoint, sid = sys.argv[1], sys.argv[2]
    seed, limit, start_at = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    finish = sys.argv[6] == "finish"
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(endpoint), sid),
                       backoff=Backoff(base=0.05, cap=1.0, attempts=30), rng=random.Random(seed))
    time.sleep(max(0.0, start_at - time.time()))  # start together
    for result in drain(queue, limit, finish=finish):
        for c in result.claims:
            print(json.dumps({"token": c.token, "row_key": c.row_key}))
        print(json.dumps({"redirected": result.redirected, "recovered": result.recovered,
                          "aimed": result.aimed, "lost": result.lost, "won": len(result.claims),
                          "requests": dict(result.requests)}))
    print(json.dumps({"sent": dict(queue.transport.calls)}))
    """
)


def _claim_with_processes(emulator: SheetsEmulator, sid: str, finish: bool = False) -> list[dict[str, Any]]:
    import time

    start_at = time.time() + 4  # interpreter start-up on a busy machine
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PROCESS_CLAIMER,
                emulator.endpoint,
                sid,
                str(i),
                str(LIMIT),
                str(start_at),
                "finish" if finish else "keep",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(CLAIMERS)
    ]
    claims: list[dict[str, Any]] = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            claims += [json.loads(line) for line in out.splitlines() if line.strip()]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return claims


def _assert_exactly_once(
    emulator: SheetsEmulator,
    sid: str,
    claims: list[dict[str, Any]],
    expected_urls: set[str],
    finished: bool = False,
) -> None:
    won = [c for c in claims if "token" in c]
    per_key = Counter(c["row_key"] for c in won)
    twice = {k: n for k, n in per_key.items() if n > 1}
    assert not twice, f"rows claimed more than once: {twice}"
    expected_keys = {row_key(normalise_url(u)) for u in expected_urls}
    missing, unexpected = expected_keys - set(per_key), set(per_key) - expected_keys
    assert not missing and not unexpected, f"{len(missing)} rows never claimed, {len(unexpected)} unexpected"
    # the sheet agrees: each claimed token sits in exactly one row, beside the URL it was claimed for
    snapshot = Snapshot.from_values(emulator.values(sid, "queue"))
    by_token = snapshot.by_token()
    for c in won:
        rows = by_token.get(c["token"], [])
        assert len(rows) == 1, f"token {c['token']} in {len(rows)} rows"
        assert rows[0].status is (Status.DONE if finished else Status.PROCESSING)
        assert row_key(normalise_url(rows[0].url)) == c["row_key"], "claim bound to the wrong row"
        if finished:
            assert rows[0].get("published_url") == published_url(rows[0].url), "link written elsewhere"
    stray = set(by_token) - {c["token"] for c in won}
    assert not stray, f"tokens in the sheet that no claimer owns: {sorted(stray)[:5]}"
    assert not [r for r in snapshot.rows if r.status is Status.NEW and r.url in expected_urls]


def _urls(n: int = ROWS) -> set[str]:
    return {f"https://news.example.com/story/{i}" for i in range(n)}


def _round_budget(record: dict[str, Any]) -> dict[str, int]:
    """What one claim round costs, per docs/sheet-queue.md, when nothing moves and nothing fails:
    1 read (the tab id and its values, one ``spreadsheets.get``); + 1 write (the claim batch) if it
    aimed at rows; + 1 read (read-back) if some claim was lost or landed on another row; + 1 write
    (the lost claims' anchors) if some was lost."""
    if record["aimed"] == 0:
        return {"spreadsheets.get": 1}
    budget = {"spreadsheets.get": 1, "spreadsheets.batchUpdate": 1 + (1 if record["lost"] else 0)}
    if record["lost"] or record["redirected"]:
        budget["values.batchGet"] = 1
    return budget


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_eight_claimers_claim_every_row_exactly_once(sheets_emulator: SheetsEmulator, mode: str) -> None:
    sid = _seed(sheets_emulator)
    race = _claim_with_threads if mode == "threads" else _claim_with_processes
    # claimers finish what they win (1,000 rows in flight would pass Google's metadata cap)
    claims = race(sheets_emulator, sid, finish=True)
    _assert_exactly_once(sheets_emulator, sid, claims, _urls(), finished=True)
    assert [m.value for m in sheets_emulator.server.store.spreadsheets[sid].all_metadata()] == []
    rounds = [c for c in claims if "aimed" in c]
    # the exact request budget: every round cost what the protocol says, its tab id included ...
    for record in rounds:
        assert dict(record["requests"]) == _round_budget(record), record
    sent = [c["sent"] for c in claims if "sent" in c]
    assert len(sent) == CLAIMERS
    # ... and the emulator saw exactly the requests the claimers counted, nothing more
    log = sheets_emulator.request_log
    total: Counter[str] = Counter()
    for s in sent:
        total.update(s)
    assert dict(log.counts) == dict(total)
    per_round: Counter[str] = Counter()
    for record in rounds:
        per_round.update(record["requests"])
        if record["won"]:  # finishing them: 1 read (the tab, anchors) + 1 write of the links, 1 batchUpdate
            per_round.update(["spreadsheets.get", "values.batchUpdateByDataFilter"])
            per_round.update(["spreadsheets.batchUpdate"])
    assert per_round == total
    assert log["spreadsheets.batchUpdate"] <= 3 * len([r for r in rounds if r["aimed"]]) < ROWS


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_exactly_once_survives_429s_and_apply_then_fail(sheets_emulator: SheetsEmulator, mode: str) -> None:
    sid = _seed(sheets_emulator)
    faults = sheets_emulator.faults
    faults.add("429", count=6, retry_after=1)  # honoured: a 1 s floor under the jitter
    faults.add("429", probability=0.15, seed=7, retry_after=0)
    faults.add("apply_then_fail", probability=0.25, seed=11, methods=["spreadsheets.batchUpdate"])
    faults.add("500", probability=0.05, seed=13, methods=["values.batchGet", "spreadsheets.get"])
    race = _claim_with_threads if mode == "threads" else _claim_with_processes
    claims = race(sheets_emulator, sid, finish=True)
    faults.clear()
    _assert_exactly_once(sheets_emulator, sid, claims, _urls(), finished=True)
    fired = sheets_emulator.request_log.snapshot()["faults"]
    assert fired.get("429", 0) >= 6 and fired.get("apply_then_fail", 0) > 0 and fired.get("500", 0) > 0, fired
    # some claims were won although their write reported failure: the read-back found the tokens
    assert sum(c.get("recovered", 0) for c in claims) > 0


def _editor(
    emulator: SheetsEmulator,
    sid: str,
    stop: threading.Event,
    inserted: list[str],
    deleted: list[str],
    seed: int,
) -> None:
    """Until stopped: insert filler rows and new articles, delete fillers and claimed rows (in
    flight or done), and sort the whole sheet by URL, anywhere, at random."""
    rng = random.Random(seed)
    service = anonymous_service(emulator.endpoint)
    sheet_id = GoogleSheetsTransport(service, sid).sheet_ids()["queue"]
    n = 0
    while not stop.is_set():
        n += 1
        values = service.spreadsheets().values().get(spreadsheetId=sid, range="queue!A:B").execute()["values"]
        size = len(values)
        action = rng.random()
        if action < 0.35 or size < 3:
            at = rng.randint(1, size)
            new = rng.random() < 0.5
            url = f"https://news.example.com/late/{seed}-{n}" if new else f"https://filler.example.com/{n}"
            if new:
                inserted.append(url)
            requests = [insert_rows(sheet_id, at), set_row(sheet_id, at, [url, "NEW" if new else "HOLD"])]
        elif action < 0.6:
            fillers = [i for i, row in enumerate(values) if len(row) > 1 and row[1] == "HOLD"]
            if not fillers:
                continue
            at = rng.choice(fillers)
            requests = [delete_rows(sheet_id, at, at + 1)]
        elif action < 0.85:
            # a claimed row: PROCESSING (its claimer may be writing it right now) or DONE
            claimed = [i for i, row in enumerate(values) if i and len(row) > 1 and "#" in row[1]]
            if not claimed:
                continue
            at = rng.choice(claimed)
            deleted.append(values[at][0])
            requests = [delete_rows(sheet_id, at, at + 1)]
        else:
            requests = [sort_rows(sheet_id, 0, descending=rng.random() < 0.5)]
        # only this editor changes the structure, so its own read-then-delete cannot miss
        batch_update(service, sid, *requests)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_exactly_once_while_the_editor_inserts_deletes_and_sorts_rows_under_the_metadata_cap(
    sheets_emulator: SheetsEmulator, mode: str
) -> None:
    assert sheets_emulator.server.store.metadata_limit == 30_000  # Google's cap, enforced
    sid = _seed(sheets_emulator)
    stop = threading.Event()
    inserted: list[str] = []
    deleted: list[str] = []
    editor = threading.Thread(target=_editor, args=(sheets_emulator, sid, stop, inserted, deleted, 5))
    editor.start()
    try:
        race = _claim_with_threads if mode == "threads" else _claim_with_processes
        # each claimer finishes the rows it wins, as article_pipeline would: 1,000 anchors at once
        # (44 characters each) would be past the cap
        claims = race(sheets_emulator, sid, finish=True)
    finally:
        stop.set()
        editor.join(timeout=60)
    # articles the editor added at the very end
    claims += _records(drain(_queue(sheets_emulator, sid, 99), LIMIT, finish=True))
    won = [c for c in claims if "token" in c]
    per_key = Counter(c["row_key"] for c in won)
    assert not {k: n for k, n in per_key.items() if n > 1}, "rows claimed more than once"
    expected = {row_key(normalise_url(u)) for u in _urls() | set(inserted)}
    assert set(per_key) == expected, "rows never claimed, or claimed from nowhere"
    snapshot = Snapshot.from_values(sheets_emulator.values(sid, "queue"))
    by_token = snapshot.by_token()
    gone = {row_key(normalise_url(u)) for u in deleted}
    for c in won:
        rows = by_token.get(c["token"], [])
        if not rows:  # the editor deleted that row after it was claimed
            assert c["row_key"] in gone
            continue
        assert len(rows) == 1 and rows[0].status is Status.DONE, f"token {c['token']} in {len(rows)} rows"
        assert row_key(normalise_url(rows[0].url)) == c["row_key"], "claim bound to the wrong row"
        assert rows[0].get("published_url") == published_url(rows[0].url), "link written to another row"
    assert not set(by_token) - {c["token"] for c in won}, "tokens in the sheet that no claimer owns"
    assert not [r for r in snapshot.rows if r.status is Status.NEW]
    fillers = [r for r in snapshot.rows if r.url.startswith("https://filler.")]
    assert all(r.status_cell.raw == "HOLD" and not r.get("reason") for r in fillers), (
        "filler rows were touched"
    )
    # every row is finished, so no anchor is left
    book = sheets_emulator.server.store.spreadsheets[sid]
    assert [m.value for m in book.all_metadata()] == []
    # the hazards really happened: claims landed on other rows, claimed rows were deleted and sorted
    assert sum(c.get("redirected", 0) for c in claims) > 0 and deleted
