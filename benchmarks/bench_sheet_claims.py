"""Sheet claims: the batched conditional protocol against the naive read-then-write protocol.

Run: ``.venv/bin/python benchmarks/bench_sheet_claims.py [--quick]``

Both protocols talk to the Sheets API emulator over HTTP through the real google-api-python-client,
and every request is counted by the emulator's request log. Printed:

1. requests per claimed row (reads and writes, steady state: the one ``spreadsheets.get`` a process
   makes for the tab ids is left out) at batch sizes 1, 10, 100 and sheet sizes 100 to 50,000
   rows, and the claims per minute each protocol can reach under Google's default quota of 60
   write and 60 read requests per minute per user, with the ratio;
2. what each protocol does when two claimers race over the same rows (claims made twice).

The naive protocol is the one from the seed post: read the sheet, then ``values.update`` the status
cell of each row picked to ``PROCESSING`` (last writer wins, no token).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))

from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheets_emulator.server import SheetsEmulatorServer

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
WRITE_QUOTA = READ_QUOTA = 60  # requests per minute per user (Google's default)


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
        queue = SheetQueue(GoogleSheetsTransport(service, sid), spread=1)
        queue.sheet_id()  # the one spreadsheets.get per process (tab ids), kept out of the steady state
        server.request_log.reset()
        claimed = 0
        started = time.perf_counter()
        for _ in range(wakeups):
            claimed += (
                len(queue.claim(batch).claims)
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
        queue = SheetQueue(GoogleSheetsTransport(service, sid), spread=1, rng=random.Random(i))
        barrier.wait()
        while True:
            got = (
                [c.url for c in queue.claim(batch).claims]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="sheet sizes 100 and 1,000 only")
    args = parser.parse_args()
    sizes = [100, 1_000] if args.quick else [100, 1_000, 10_000, 50_000]
    server = SheetsEmulatorServer(port=0, state=None).start()
    try:
        print("Requests per claimed row and claims/minute under 60 writes + 60 reads per minute")
        print(
            f"{'rows':>7} {'batch':>5} | {'protocol r/w per claim':>23} {'claims/min':>10} |"
            f" {'naive r/w per claim':>20} {'claims/min':>10} | {'ratio':>6} | {'s/wake-up p/n':>14}"
        )
        for rows in sizes:
            for batch in (1, 10, 100):
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
        print("Two claimers racing over 200 NEW rows, batch 20")
        for name in ("protocol", "naive"):
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
    finally:
        server.stop()


if __name__ == "__main__":
    main()
