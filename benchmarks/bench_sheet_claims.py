"""Sheet claims: the batched conditional protocol against the naive read-then-write protocol.

Run: ``.venv/bin/python benchmarks/bench_sheet_claims.py [--quick | --tiny] [--quota-seconds S] [--quota-only]``
(``--tiny``: 100 rows, batch 1 and 10, no race and no quota run; a check that it runs, seconds)

Both protocols talk to the Sheets API emulator over HTTP through the real google-api-python-client,
and every request is counted by the emulator's request log. Each protocol wake-up is what one
``claim_rows`` task does: a fresh :class:`~onceflow.sheets.protocol.SheetQueue`, whose one read
(a ``spreadsheets.get`` bringing the tab id with the values) is counted with the rest. Printed,
with the load average beside each section:

1. requests per claimed row (reads and writes, every request of the wake-up) at batch sizes 1, 10,
   100 and sheet sizes 100 to 50,000 rows, and the claims per minute each protocol can reach under
   Google's default quota of 60 write and 60 read requests per minute per user, with the ratio;
2. what each protocol does when two claimers race over the same rows (claims made twice);
3. measured under quota: each protocol runs against its own emulator that *enforces* 60 reads and
   60 writes per minute (429 + ``Retry-After`` past them, as Google does) for ``--quota-seconds``
   of wall time (default 60, ``--quick`` 20), side by side, and the claims it completed are
   counted: claims/min reached at batch 1, 10 and 100, and the ratio. The run is cut into at
   least two quota windows of at most 60 s, the limit scaled to match (still 60 per minute), so
   every run crosses a window edge and the backoff after real 429s is part of what is measured;
4. end to end under the same quota: each claimed row also runs what ``article_pipeline``'s first
   task does with the sheet (``write_fields``, its check on the same read); the naive side reads the row and
   writes its fields by row number. Rows/min measured, and the steady state computed from the
   measured requests per row;
5. Sheets requests per article, counted: a ``sheet_claim`` wake-up in the steady state (K NEW
   rows to claim while the DONE of the K rows the previous wake-up claimed waits in a ledger's
   outbox, committed as ``publish`` commits it; one ``wake_up`` with a fresh queue, the relay
   riding in the claim's read and ``batchUpdate``), beside the claim alone and a relay pass alone
   (``write_back``'s), and the first task's ``write_fields``; and the articles/min ceiling each
   total allows under 60 reads + 60 writes per minute.

The naive protocol is the one from the seed post: read the sheet, then ``values.update`` the status
cell of each row picked to ``PROCESSING`` (last writer wins, no token). Under quota both sides use
the same :class:`~onceflow.sheets.retry.Backoff` (honours ``Retry-After``).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))

from onceflow.sheets.model import Row, Snapshot, Status, token_time
from onceflow.sheets.protocol import Claim, SheetQueue
from onceflow.sheets.retry import Backoff, QuotaExceeded
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.validation import judge_url
from onceflow.testing.sheets_emulator.quota import Quota
from onceflow.testing.sheets_emulator.server import METHODS, SheetsEmulatorServer

if TYPE_CHECKING:
    from collections.abc import Callable

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
WRITE_QUOTA = READ_QUOTA = 60  # requests per minute per user (Google's default)


def load() -> str:
    """The 1-, 5- and 15-minute load averages, printed beside every measured section."""
    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg())


def wakeup(transport: GoogleSheetsTransport, batch: int, **kwargs: Any) -> list[Claim]:
    """One ``claim_rows`` task's sheet requests: a fresh queue (so its one ``spreadsheets.get``
    for the tab ids is paid, as every task pays it), then the claim."""
    return SheetQueue(transport, **kwargs).claim(batch).claims


def emulator() -> SheetsEmulatorServer:
    """An in-memory emulator without Google's developer metadata cap: the rows claimed here are
    never finished (finishing is what removes a row's anchor, see docs/sheet-queue.md), so with
    the cap on, a run that claims thousands of rows would be refused for anchors that production
    would have deleted long before. Request counts do not depend on it."""
    return SheetsEmulatorServer(port=0, state=None, metadata_limit=None)


def seed(server: SheetsEmulatorServer, rows: int) -> str:
    data = [HEADER] + [[f"https://bench.example.com/{i}", "NEW"] for i in range(rows)]
    return str(server.seed({"title": "bench", "sheets": {"queue": data}})["spreadsheetId"])


def naive_claim(service: Any, sid: str, batch: int) -> list[str]:
    """Read the sheet, then write PROCESSING into each picked row's status cell, one request each."""
    values = service.spreadsheets().values().get(spreadsheetId=sid, range="queue").execute().get("values", [])
    snapshot = Snapshot.from_values(values)
    assert snapshot.columns is not None
    col = chr(ord("A") + snapshot.columns["status"])
    picked = [r for r in snapshot.rows if r.status is Status.NEW][:batch]
    for row in picked:
        service.spreadsheets().values().update(
            spreadsheetId=sid,
            range=f"queue!{col}{row.number}",
            valueInputOption="RAW",
            body={"values": [["PROCESSING"]]},
        ).execute()
    return [r.url for r in picked]


def measure(server: SheetsEmulatorServer, rows: int, batch: int, wakeups: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in ("protocol", "naive"):
        sid = seed(server, rows)
        service = anonymous_service(server.endpoint)
        transport = GoogleSheetsTransport(service, sid)
        server.request_log.reset()
        claimed = 0
        started = time.perf_counter()
        for _ in range(wakeups):
            claimed += (
                len(wakeup(transport, batch, spread=1))
                if name == "protocol"
                else len(naive_claim(service, sid, batch))
            )
        elapsed = time.perf_counter() - started
        log = server.request_log
        reads, writes = log.reads, log.writes
        out[name] = {
            "claimed": claimed,
            "reads_per_claim": reads / claimed,
            "writes_per_claim": writes / claimed,
            "claims_per_min": min(WRITE_QUOTA / (writes / claimed), READ_QUOTA / (reads / claimed)),
            "seconds_per_wakeup": elapsed / wakeups,
        }
    return out


def later_writes(server: SheetsEmulatorServer, rows: int = 1_000, claims: int = 10) -> tuple[float, float]:
    """Requests per ``write_fields`` (score, link, run id written through the row anchor)."""
    sid = seed(server, rows)
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(server.endpoint), sid), spread=1)
    won = queue.claim(claims).claims
    server.request_log.reset()
    for claim in won:
        queue.write_fields(
            claim.token, {"score": "0.9", "published_url": f"https://pub.example/{claim.row_key}"}
        )
    log = server.request_log
    return log.reads / len(won), log.writes / len(won)


def race(server: SheetsEmulatorServer, name: str, rows: int = 200, batch: int = 20) -> tuple[int, int]:
    """Two claimers over the same rows; return (claims made, rows claimed more than once)."""
    sid = seed(server, rows)
    server.request_log.reset()
    claims: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def claimer(i: int) -> None:
        service = anonymous_service(server.endpoint)
        transport = GoogleSheetsTransport(service, sid)
        rng = random.Random(i)
        barrier.wait()
        while True:
            got = (
                [c.url for c in wakeup(transport, batch, spread=1, rng=rng)]
                if name == "protocol"
                else naive_claim(service, sid, batch)
            )
            with lock:
                claims.extend(got)
            if not got:
                return

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    twice = sum(1 for n in Counter(claims).values() if n > 1)
    return len(claims), twice


# -- measured under an enforced quota ---------------------------------------------------------------


class Deadline(Exception):
    """The measured wall time is over (raised instead of sleeping past it)."""


def deadline_sleep(deadline: float) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        if time.monotonic() + seconds > deadline:
            raise Deadline
        time.sleep(seconds)

    return sleep


def quota_backoff(deadline: float, seed: int) -> Backoff:
    """The production policy (jittered, honours Retry-After), with a budget that never runs out."""
    return Backoff(attempts=1_000_000, sleep=deadline_sleep(deadline), rng=random.Random(seed))


def naive_execute(backoff: Backoff, request: Any) -> Any:
    """One request of the naive protocol, resent after a 429 as the same backoff says."""
    from googleapiclient.errors import HttpError

    def once() -> Any:
        try:
            return request.execute(num_retries=0)
        except HttpError as err:
            if int(err.resp.status) == 429:
                after = err.resp.get("retry-after")
                raise QuotaExceeded("429", float(after) if after is not None else None) from err
            raise

    return backoff.call(once)


@dataclass
class Side:
    """One measured run: its own emulator, client and counters."""

    name: str
    server: SheetsEmulatorServer
    sid: str
    service: Any
    queue: SheetQueue
    done: int = 0  # claims (or, end to end, rows processed) completed before the deadline
    claimed: int = 0
    refused: int = 0  # requests answered 429 by the quota
    error: BaseException | None = None


def side_wakeup(side: Side, batch: int) -> list[Claim]:
    """One task's claim on this side: a fresh queue with the side's backoff and random source."""
    claims = wakeup(side.queue.transport, batch, backoff=side.queue.backoff, rng=side.queue.rng)
    if not claims:
        raise RuntimeError("the sheet ran out of NEW rows: seed more")
    return claims


def protocol_claims(side: Side, batch: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        claims = side_wakeup(side, batch)
        if time.monotonic() <= deadline:
            side.done += len(claims)


def naive_claims(side: Side, batch: int, deadline: float, process: bool = False) -> None:
    backoff = side.queue.backoff
    values = side.service.spreadsheets().values()
    while time.monotonic() < deadline:
        got = naive_execute(backoff, values.get(spreadsheetId=side.sid, range="queue"))
        snapshot = Snapshot.from_values(got.get("values", []))
        assert snapshot.columns is not None
        status, run_id = snapshot.columns["status"], snapshot.columns["run_id"]
        picked = [r for r in snapshot.rows if r.status is Status.NEW][:batch]
        if not picked:
            raise RuntimeError("the sheet ran out of NEW rows: seed more")
        for row in picked:
            cell = f"queue!{chr(ord('A') + status)}{row.number}"
            body = {"values": [["PROCESSING"]]}
            naive_execute(
                backoff, values.update(spreadsheetId=side.sid, range=cell, valueInputOption="RAW", body=body)
            )
            if time.monotonic() <= deadline:
                side.claimed += 1
                side.done += 0 if process else 1
        for row in picked if process else []:
            # what the first task would do without anchors: read the row, write its fields by number
            naive_execute(
                backoff, values.get(spreadsheetId=side.sid, range=f"queue!{row.number}:{row.number}")
            )
            cell = f"queue!{chr(ord('A') + run_id)}{row.number}"
            body = {"values": [[f"article_pipeline__{row.number}"]]}
            naive_execute(
                backoff, values.update(spreadsheetId=side.sid, range=cell, valueInputOption="RAW", body=body)
            )
            if time.monotonic() <= deadline:
                side.done += 1


def protocol_end_to_end(side: Side, batch: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        claims = side_wakeup(side, batch)
        if time.monotonic() <= deadline:
            side.claimed += len(claims)
        for claim in claims:
            first_task(side.queue, claim)
            if time.monotonic() <= deadline:
                side.done += 1


def first_task(queue: SheetQueue, claim: Claim) -> None:
    """The sheet calls of ``article_pipeline``'s first task (``ClaimedRowOperator._read_row``): a
    fresh queue per task, ``write_fields`` run id and claim time, with the same-article check
    riding on ``write_fields``' own read."""
    task = SheetQueue(queue.transport, backoff=queue.backoff)
    fields = {"run_id": claim.run_id, "claim_token": claim.token}
    claimed_at = token_time(claim.token)
    if claimed_at is not None:
        fields["claimed_at"] = claimed_at.isoformat(timespec="seconds")

    def same_article(row: Row) -> None:
        if judge_url(row).key != claim.row_key:
            raise LookupError(f"row {row.number} now points at {row.url!r}, not {claim.url!r}")

    task.write_fields(claim.token, fields, check=same_article)


def _publish_done(ledger: Any, target: str, claim: Claim) -> None:
    """``publish``'s commit of ``claim``: its result and the row's DONE in one transaction."""
    from onceflow.ledger.steps import run_keyed_step
    from onceflow.sheets.ledger_link import work_key
    from onceflow.sheets.relay import row_write

    fields = {
        "score": "0.90",
        "published_url": f"https://pub.example/{claim.row_key}",
        "run_id": claim.run_id,
    }
    write = row_write(target, claim.token, Status.DONE, fields, row_key=claim.row_key)
    run_keyed_step(
        ledger, kind="article", work_key=work_key(claim.row_key), step="publish", owner="bench",
        worker_version="v1", work=lambda _lease: {"url": fields["published_url"]},
        follow_ups=lambda _result: [write],
    )  # fmt: skip


def _ledger_with_done(server: SheetsEmulatorServer, sid: str, claims: list[Claim], tmp: str) -> Any:
    """A SQLite ledger whose outbox holds the DONE of each of ``claims``, as ``publish`` commits it."""
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.sheets.relay import sheet_target

    ledger = Ledger(create_ledger_engine(f"sqlite:///{tmp}/ledger.db"))
    for claim in claims:
        _publish_done(ledger, sheet_target(sid, "queue"), claim)
    return ledger


def relay_cost(server: SheetsEmulatorServer, batch: int) -> tuple[float, float]:
    """Requests per article of a relay pass alone (``write_back``'s, a chain's own): ``batch``
    claimed rows' DONE committed to a SQLite ledger's outbox, then one pass with a fresh queue."""
    import tempfile

    from onceflow.sheets.relay import relay_sheet_rows

    sid = seed(server, batch)
    claims = SheetQueue(GoogleSheetsTransport(anonymous_service(server.endpoint), sid), spread=1).claim(batch)
    with tempfile.TemporaryDirectory() as tmp:
        ledger = _ledger_with_done(server, sid, claims.claims, tmp)
        try:
            server.request_log.reset()
            queue = SheetQueue(GoogleSheetsTransport(anonymous_service(server.endpoint), sid))
            report = relay_sheet_rows(ledger, lambda _sid, _tab: queue)
        finally:
            ledger.engine.dispose()
    assert sorted(report.written) == sorted(c.token for c in claims.claims), report
    log = server.request_log
    return log.reads / batch, log.writes / batch


def wakeup_cost(server: SheetsEmulatorServer, batch: int) -> tuple[float, float]:
    """Requests per article of a ``sheet_claim`` wake-up in the steady state: ``batch`` NEW rows to
    claim while the DONE of the ``batch`` rows the previous wake-up claimed waits in the outbox;
    one :func:`~onceflow.sheets.wakeup.wake_up` with a fresh queue (the relay riding in the claim's
    read and batch) claims the first and writes the second: (reads, writes) per article."""
    import tempfile

    from onceflow.sheets.wakeup import wake_up

    sid = seed(server, 2 * batch)
    earlier = SheetQueue(GoogleSheetsTransport(anonymous_service(server.endpoint), sid), spread=1).claim(
        batch
    )
    with tempfile.TemporaryDirectory() as tmp:
        ledger = _ledger_with_done(server, sid, earlier.claims, tmp)
        try:
            server.request_log.reset()
            queue = SheetQueue(GoogleSheetsTransport(anonymous_service(server.endpoint), sid), spread=1)
            woke = wake_up(queue, ledger, batch)
        finally:
            ledger.engine.dispose()
    assert len(woke.claim.claims) == batch, woke.claim
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier.claims), woke.relayed
    log = server.request_log
    return log.reads / batch, log.writes / batch


def per_article(server: SheetsEmulatorServer, batches: list[int], task: tuple[float, float]) -> None:
    """Sheets requests per article: a ``sheet_claim`` wake-up that claims K rows and relays K
    write-backs (the relay riding in the claim's read and batch), beside the claim alone and a
    relay pass alone; + the first task."""
    print(
        "Sheets requests per article, counted: a sheet_claim wake-up claiming K rows and relaying K"
        " write-backs, beside a claim alone and a relay pass alone (spreadsheets.get included);"
        " article_pipeline's first task; ceilings under 60 reads + 60 writes per minute;"
        f" {load()}"
    )
    print(
        f"{'K':>4} | {'claim r/w':>11} | {'relay alone r/w':>15} | {'wake-up: claim+write-back r/w':>29}"
        f" {'art/min':>8} | {'+ first task r/w':>16} {'art/min':>8}"
    )
    for batch in batches:
        claim = measure(server, max(100, 2 * batch), batch, 2)["protocol"]
        c = (claim["reads_per_claim"], claim["writes_per_claim"])
        r = relay_cost(server, batch)
        both = wakeup_cost(server, batch)
        every = (both[0] + task[0], both[1] + task[1])
        print(
            f"{batch:>4} | {c[0]:>5.2f}/{c[1]:<5.2f} | {r[0]:>7.2f}/{r[1]:<7.2f} |"
            f" {both[0]:>14.2f}/{both[1]:<14.2f} {rate(*both):>8.0f} |"
            f" {every[0]:>7.2f}/{every[1]:<8.2f} {rate(*every):>8.1f}",
            flush=True,
        )


def first_task_cost(server: SheetsEmulatorServer, claims: int = 10) -> tuple[float, float]:
    """Requests per row of :func:`first_task`, without a quota: (reads, writes)."""
    sid = seed(server, 100)
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(server.endpoint), sid), spread=1)
    won = queue.claim(claims).claims
    server.request_log.reset()
    for claim in won:
        first_task(queue, claim)
    log = server.request_log
    return log.reads / len(won), log.writes / len(won)


def quota_shape(seconds: float) -> tuple[float, int]:
    """(window seconds, requests admitted per window): 60 per minute, at least two windows per run."""
    windows = max(2, math.ceil(seconds / 60))
    window = seconds / windows
    return window, max(1, round(window))


def run_sides(jobs: list[tuple[str, Callable[[Side, float], None]]], rows: int, seconds: float) -> list[Side]:
    """Run each job against its own quota-enforcing emulator, all at once, for ``seconds``."""
    window, limit = quota_shape(seconds)
    sides: list[tuple[Side, Callable[[Side, float], None]]] = []
    for i, (name, job) in enumerate(jobs):
        server = emulator().start()
        sid = seed(server, rows)
        service = anonymous_service(server.endpoint)
        queue = SheetQueue(GoogleSheetsTransport(service, sid), rng=random.Random(i))
        queue.sheet_id()  # the client's one-off set-up before the clock starts (each wake-up gets again)
        service.spreadsheets().values()
        sides.append((Side(name, server, sid, service, queue), job))
    start = time.monotonic() + 0.5
    deadline = start + seconds

    def run(side: Side, job: Callable[[Side, float], None]) -> None:
        time.sleep(max(0.0, start - time.monotonic()))
        try:
            job(side, deadline)
        except Deadline:
            pass
        except BaseException as err:
            side.error = err

    for i, (side, _) in enumerate(sides):
        side.queue.backoff = quota_backoff(deadline, i)
        side.server.request_log.reset()
        side.server.quota = Quota(limit, limit, window)
    threads = [threading.Thread(target=run, args=pair) for pair in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for side, _ in sides:
        side.server.stop()
        side.refused = side.server.request_log.snapshot()["faults"].get("quota", 0)
        if side.error is not None:
            raise RuntimeError(f"{side.name} failed") from side.error
    return [side for side, _ in sides]


def admitted(side: Side) -> tuple[int, int]:
    """Reads and writes the quota admitted (the request log also counts the 429s)."""
    reads = writes = 0
    for event in side.server.request_log.timeline:
        if event.status != 429:
            if METHODS[event.method][1]:
                writes += 1
            else:
                reads += 1
    return reads, writes


def per_unit(side: Side) -> tuple[float, float]:
    """Admitted reads and writes per completed claim (or processed row)."""
    reads, writes = admitted(side)
    done = max(1, side.done)
    return reads / done, writes / done


def rate(reads: float, writes: float) -> float:
    """Units per minute under 60 reads + 60 writes per minute, at that many requests per unit."""
    return min(READ_QUOTA / reads if reads else math.inf, WRITE_QUOTA / writes if writes else math.inf)


def measure_under_quota(
    seconds: float, batches: list[int], e2e_batch: int, task: tuple[float, float]
) -> None:
    """Claims/min (and, at ``e2e_batch``, processed rows/min) measured under an enforced quota.

    :param task: requests per row of :func:`first_task` (reads, writes), for the computed rows/min.
    """
    window, limit = quota_shape(seconds)
    per_min = 60 / seconds
    print(
        f"Measured under the emulator's enforced quota: {limit} reads + {limit} writes per {window:g} s"
        f" window (= {limit * 60 / window:g}/min each); {seconds:g} s of wall time per side, sides at once;"
        f" {load()}"
    )
    print(
        f"{'batch':>5} | {'protocol claims/min':>19} {'429s':>5} | {'naive claims/min':>16} {'429s':>5} |"
        f" {'ratio':>6} | {'computed from request counts p / n':>34} | quota used, writes p / n"
    )
    capacity = round(limit * seconds / window)
    e2e: list[Side] = []
    for batch in batches:
        rows = int(batch * limit * seconds / window * 1.3) + 4 * batch + 100

        def claims_p(side: Side, deadline: float, batch: int = batch) -> None:
            protocol_claims(side, batch, deadline)

        def claims_n(side: Side, deadline: float, batch: int = batch) -> None:
            naive_claims(side, batch, deadline)

        def e2e_p(side: Side, deadline: float, batch: int = batch) -> None:
            protocol_end_to_end(side, batch, deadline)

        def e2e_n(side: Side, deadline: float, batch: int = batch) -> None:
            naive_claims(side, batch, deadline, process=True)

        jobs: list[tuple[str, Callable[[Side, float], None]]] = [("protocol", claims_p), ("naive", claims_n)]
        if batch == e2e_batch:
            jobs += [("protocol", e2e_p), ("naive", e2e_n)]
        p, n, *rest = run_sides(jobs, rows, seconds)
        e2e += rest
        p_rate, n_rate = p.done * per_min, n.done * per_min
        ratio = f"{p_rate / n_rate:5.1f}x" if n_rate else "  n/a"
        # per protocol wake-up: 1 read (the tab and its id, one spreadsheets.get) + 1 write; naive:
        # 1 read per wake-up + 1 write per row (this column said 2 reads, the ids' get of before 2026-12-02)
        computed = f"{rate(1 / batch, 1 / batch):,.0f} / {rate(1 / batch, 1.0):,.0f}"
        print(
            f"{batch:>5} | {p_rate:>19,.0f} {p.refused:>5} | {n_rate:>16,.0f} {n.refused:>5} | {ratio} |"
            f" {computed:>34} | {admitted(p)[1]}/{capacity} / {admitted(n)[1]}/{capacity}",
            flush=True,
        )
    if e2e:
        print()
        print(
            f"End to end, measured under the same quota at batch {e2e_batch}: each claimed row also makes"
            " the sheet calls of article_pipeline's first task (protocol: write_fields with its check; naive:"
            " read the row, then write its fields by row number)"
        )
        for side in e2e:
            reads, writes = per_unit(side)
            print(
                f"  {side.name:>8}: {side.done * per_min:5.1f} rows/min ({side.claimed} claimed,"
                f" {side.done} processed, {side.refused} 429s; {reads:.2f} reads + {writes:.2f} writes per row)"
            )
    task_r, task_w = task
    print()
    print(
        f"End to end, computed from requests per row: the claim's share (1 read + 1 write per wake-up)"
        f" plus the first task (measured: {task_r:.2f} reads + {task_w:.2f} writes per row; naive 1 + 1);"
        " the write-back relay's share is in the per-article section"
    )
    print(f"{'batch':>5} | {'protocol claims/min':>19} | {'protocol rows/min':>17} | {'naive rows/min':>14}")
    for batch in (1, 10, 50, 100):
        print(
            f"{batch:>5} | {rate(1 / batch, 1 / batch):>19,.0f} |"
            f" {rate(1 / batch + task_r, 1 / batch + task_w):>17.1f} | {rate(1 / batch + 1, 2.0):>14.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="sheet sizes 100 and 1,000 only; 20 s under quota"
    )
    parser.add_argument(
        "--quota-seconds",
        type=float,
        default=None,
        help="wall time of each measured run under the enforced quota (default 60, 20 with --quick; 0 skips it)",
    )
    parser.add_argument(
        "--tiny", action="store_true", help="100 rows, batch 1 and 10, no race, no quota run: proves it runs"
    )
    parser.add_argument("--quota-only", action="store_true", help="only the measured-under-quota section")
    parser.add_argument("--e2e-batch", type=int, default=10, help="batch of the end-to-end run (default 10)")
    args = parser.parse_args()
    quota_seconds = args.quota_seconds if args.quota_seconds is not None else (20.0 if args.quick else 60.0)
    quota_seconds = 0.0 if args.tiny else quota_seconds
    if args.quota_only:
        if quota_seconds <= 0:
            parser.error("--quota-only needs --quota-seconds > 0")
        with emulator() as server:
            task = first_task_cost(server)
        measure_under_quota(quota_seconds, [1, 10, 100], args.e2e_batch, task)
        return
    sizes = [100] if args.tiny else [100, 1_000] if args.quick else [100, 1_000, 10_000, 50_000]
    batches = [1, 10] if args.tiny else [1, 10, 100]
    server = emulator().start()
    try:
        print(
            "Requests per claimed row (every request of each wake-up, spreadsheets.get included) and"
            f" claims/minute under 60 writes + 60 reads per minute; {load()}"
        )
        print(
            f"{'rows':>7} {'batch':>5} | {'protocol r/w per claim':>23} {'claims/min':>10} |"
            f" {'naive r/w per claim':>20} {'claims/min':>10} | {'ratio':>6} | {'s/wake-up p/n':>14}"
        )
        for rows in sizes:
            for batch in batches:
                if batch > rows:
                    continue
                wakeups = max(1, min(5, rows // batch))
                m = measure(server, rows, batch, wakeups)
                p, n = m["protocol"], m["naive"]
                print(
                    f"{rows:>7} {batch:>5} |"
                    f" {p['reads_per_claim']:>11.3f} / {p['writes_per_claim']:<9.3f}"
                    f" {p['claims_per_min']:>10.0f} |"
                    f" {n['reads_per_claim']:>8.3f} / {n['writes_per_claim']:<9.3f}"
                    f" {n['claims_per_min']:>10.0f} | {p['claims_per_min'] / n['claims_per_min']:>5.1f}x |"
                    f" {p['seconds_per_wakeup']:>6.2f}/{n['seconds_per_wakeup']:<6.2f}",
                    flush=True,
                )
        print()
        for name in () if args.tiny else ("protocol", "naive"):
            if name == "protocol":
                print(f"Two claimers racing over 200 NEW rows, batch 20; {load()}")
            made, twice = race(server, name)
            log = server.request_log
            print(
                f"  {name:>8}: {made} claims made, {twice} rows claimed twice;"
                f" {log.reads} reads + {log.writes} writes"
            )
        print()
        reads, writes = later_writes(server)
        print(
            f"Later writes through the row anchor: {reads:.1f} reads + {writes:.1f} writes per write_fields"
        )
        task = first_task_cost(server)
        print(
            f"article_pipeline's first task (write_fields with its check): {task[0]:.1f} reads + {task[1]:.1f}"
            " writes per row"
        )
        print()
        per_article(server, [1, 10] if args.tiny else [1, 10, 50], task)
    finally:
        server.stop()
    if quota_seconds > 0:
        print()
        measure_under_quota(quota_seconds, [1, 10, 100], args.e2e_batch, task)


if __name__ == "__main__":
    main()
