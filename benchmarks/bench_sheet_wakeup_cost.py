"""Requests per wake-up of the sheet claim protocol, claiming and finishing, alone and racing.

Real google-api-python-client against the in-process Sheets emulator (Google's developer metadata
cap on, its default). Each claimer drains the queue K rows at a time and, after every wake-up,
finishes the rows it won as ``article_pipeline`` would (``SheetQueue.finish_many``: link written,
row DONE, row anchor removed in the same batch). Counts come from each claimer's transport; the
tab ids' ``spreadsheets.get`` is left out (one per task, see docs/sheet-queue.md).

    python benchmarks/bench_sheet_wakeup_cost.py            # 1,000 rows, K=40, 1 and 8 claimers
    python benchmarks/bench_sheet_wakeup_cost.py --quick    # 200 rows, K=20, 1 and 4 claimers
"""

from __future__ import annotations

import argparse
import os
import random
from collections import Counter

from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.retry import Backoff
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_races import run_claimers
from onceflow.testing.sheets_emulator import SheetsEmulatorServer

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
READS = {"values.batchGet", "values.batchGetByDataFilter", "developerMetadata.search", "spreadsheets.get"}


def _split(counts: Counter[str]) -> tuple[int, int]:
    reads = sum(n for method, n in counts.items() if method in READS)
    return reads, sum(counts.values()) - reads


def measure(claimers: int, rows: int, k: int) -> dict[str, float]:
    """One race; per wake-up (a claim that aimed at rows) reads and writes of claim and finish."""
    with SheetsEmulatorServer() as emulator:
        data = [HEADER] + [[f"https://news.example.com/{i}", "NEW"] for i in range(rows)]
        sid = emulator.seed({"title": "bench", "sheets": {"queue": data}})["spreadsheetId"]
        queues = [
            SheetQueue(
                GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid),
                backoff=Backoff(base=0.05, cap=1.0, attempts=30),
                rng=random.Random(i),
            )
            for i in range(claimers)
        ]
        results = [r for per_claimer in run_claimers(queues, k, finish=True) for r in per_claimer]
        claim: Counter[str] = Counter()
        for result in results:
            claim.update(result.requests)
        total: Counter[str] = Counter()
        for queue in queues:
            total.update(queue.transport.calls)
        for counts in (claim, total):
            counts.pop("spreadsheets.get", None)
        wakeups = [r for r in results if r.aimed]
        idle = len(results) - len(wakeups)  # each claimer's last read, which found nothing
        claim_reads, claim_writes = _split(claim)
        finish_reads, finish_writes = _split(total - claim)
        n = len(wakeups)
        return {
            "wake-ups": n,
            "lost": sum(r.lost for r in wakeups),
            "claim reads": (claim_reads - idle) / n,
            "claim writes": claim_writes / n,
            "finish reads": finish_reads / n,
            "finish writes": finish_writes / n,
            "anchors left": len(emulator.store.spreadsheets[sid].all_metadata()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 rows, K=20, 1 and 4 claimers")
    args = parser.parse_args()
    rows, k, racers = (200, 20, 4) if args.quick else (1000, 40, 8)
    print(f"load average {os.getloadavg()[0]:.1f}; {rows} NEW rows, K={k}, metadata cap on")
    print(
        "| claimers | wake-ups | claims lost | claim: reads + writes per wake-up | finish: reads + writes per wake-up | anchors left |"
    )
    print("|---|---|---|---|---|---|")
    for claimers in (1, racers):
        m = measure(claimers, rows, k)
        print(
            f"| {claimers} | {m['wake-ups']:.0f} | {m['lost']:.0f} | {m['claim reads']:.2f} + "
            f"{m['claim writes']:.2f} | {m['finish reads']:.2f} + {m['finish writes']:.2f} | "
            f"{m['anchors left']:.0f} |"
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
