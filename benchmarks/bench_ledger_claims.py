"""Claims per second for 1, 4, 16 and 64 concurrent claimers: SKIP LOCKED against the naive ways,
and the full ledger claim against the bare one.

Run: ``.venv/bin/python benchmarks/bench_ledger_claims.py [--items N] [--claimers 1,4,16,64]
[--repeat R] [--batch B] [--quick]`` (PostgreSQL on 127.0.0.1:5432, or
``ONCEFLOW_TEST_DATABASE_URL``). It creates its own databases and drops them at the end. The
load average is printed before and after every claimer count: figures measured while other jobs
load the machine are not comparable with an idle machine's.

The seed's story as numbers: "add more workers" (no lock: duplicates), "add a DB lock" (one
lock: correct but serial), and the answer (``FOR UPDATE SKIP LOCKED``). Every claimer is a thread
with its own database connection; each claims one job, marks it done, and repeats until no job
is left. Strategies, on the same ``jobs`` table:

* ``skip_locked``: one ``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``;
* ``for_update``: the same ``SELECT ... FOR UPDATE`` without ``SKIP LOCKED``: claimers queue on
  the same first row, and a waiter whose row was taken meanwhile gets nothing (counted as
  ``empty``) and must try again;
* ``lock_table``: ``LOCK TABLE jobs IN EXCLUSIVE MODE`` around read-then-update (one at a time);
* ``no_lock``: read the first pending job, then update it: duplicates;
* ``ledger``: the real :class:`onceflow.ledger.Ledger` (SKIP LOCKED batch claim of ``--batch``
  items with their audit rows, then a fenced ``commit_result`` with result and transition rows
  per item), to show what the whole bookkeeping costs.

Claims alone, side by side (each claimer claims until nothing is left; nothing is completed):

* ``bare_claim``: the ``skip_locked`` statement alone: one item, its state and token;
* ``ledger_claim``: ``Ledger.claim()``: one item per round trip, with lease expiry from the
  database clock, fencing token + 1, attempts + 1 and its ``claim`` transition row, checked
  against the state table;
* ``ledger_batch``: ``Ledger.claim_many(limit=--batch)``: the same per item (one lease, one
  token and one audit row each), ``--batch`` items per round trip.

The ratio ``bare_claim / ledger_batch`` is what the full ledger claim costs over the bare one.

Printed per strategy and claimer count: claims/s, duplicates (jobs processed more than once),
deadlocks (``DeadlockDetected`` caught and retried), empty claims, then the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))

import psycopg2
import psycopg2.errors
from sqlalchemy.engine import make_url

from onceflow.testing import postgres

STRATEGIES = ["skip_locked", "for_update", "lock_table", "no_lock", "ledger"]
CLAIM_ONLY = ["bare_claim", "ledger_claim", "ledger_batch"]
LEDGER_STRATEGIES = {"ledger", "ledger_claim", "ledger_batch"}

CLAIM_SKIP_LOCKED = """
UPDATE jobs SET state = 'leased', owner = %s, token = token + 1
WHERE id = (SELECT id FROM jobs WHERE state = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, token
"""
PICK_FOR_UPDATE = "SELECT id, token FROM jobs WHERE state = 'pending' ORDER BY id LIMIT 1 FOR UPDATE"
PICK_PLAIN = "SELECT id, token FROM jobs WHERE state = 'pending' ORDER BY id LIMIT 1"
LEASE = "UPDATE jobs SET state = 'leased', owner = %s, token = token + 1 WHERE id = %s RETURNING token"
DONE = "UPDATE jobs SET state = 'done' WHERE id = %s AND token = %s"
ANY_PENDING = "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'pending')"


@dataclass
class Tally:
    processed: list[int] = field(default_factory=list)
    deadlocks: int = 0
    empty: int = 0
    errors: Counter[str] = field(default_factory=Counter)


def _connect(url: str) -> Any:
    u = make_url(url)
    conn = psycopg2.connect(
        host=u.host, port=u.port or 5432, user=u.username, password=u.password, dbname=u.database
    )
    conn.autocommit = False
    return conn


def _claim_one(cur: Any, strategy: str, owner: str) -> tuple[int, int] | None:
    """One claim in the current transaction; ``None`` when nothing was returned."""
    if strategy == "skip_locked":
        cur.execute(CLAIM_SKIP_LOCKED, (owner,))
        row = cur.fetchone()
        return None if row is None else (row[0], row[1])
    if strategy == "lock_table":
        cur.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
    cur.execute(PICK_FOR_UPDATE if strategy == "for_update" else PICK_PLAIN)
    row = cur.fetchone()
    if row is None:
        return None
    cur.execute(LEASE, (owner, row[0]))
    return row[0], cur.fetchone()[0]


def sql_claimer(url: str, strategy: str, owner: str, tally: Tally, start: threading.Barrier) -> None:
    conn = _connect(url)
    cur = conn.cursor()
    start.wait()
    try:
        while True:
            try:
                claimed = _claim_one(cur, "skip_locked" if strategy == "bare_claim" else strategy, owner)
                conn.commit()
                if strategy == "bare_claim":  # claims alone: nothing is completed
                    if claimed is None:
                        return
                    tally.processed.append(claimed[0])
                    continue
                if claimed is None:
                    cur.execute(ANY_PENDING)
                    more = cur.fetchone()[0]
                    conn.commit()
                    if not more:
                        return
                    tally.empty += 1  # for_update: the row we queued on was taken meanwhile
                    continue
                cur.execute(DONE, claimed)
                conn.commit()
                tally.processed.append(claimed[0])
            except psycopg2.errors.DeadlockDetected:
                conn.rollback()
                tally.deadlocks += 1
            except psycopg2.Error as exc:
                conn.rollback()
                tally.errors[type(exc).__name__] += 1
                if sum(tally.errors.values()) > 100:
                    return
    finally:
        conn.close()


def ledger_claimer(
    ledger: Any, strategy: str, batch: int, owner: str, tally: Tally, start: threading.Barrier
) -> None:
    limit = 1 if strategy == "ledger_claim" else batch
    start.wait()
    while True:
        try:
            leases = ledger.claim_many("job", owner, 60, "v1", limit=limit)
            if not leases:
                return
            for lease in leases:
                if strategy == "ledger":
                    ledger.commit_result(lease, "bench", {"by": owner})
                tally.processed.append(int(lease.work_key))
        except Exception as exc:
            orig = getattr(exc, "orig", exc)
            if isinstance(orig, psycopg2.errors.DeadlockDetected):
                tally.deadlocks += 1
            else:
                tally.errors[type(orig).__name__] += 1
                if sum(tally.errors.values()) > 100:
                    return


def prepare_jobs(url: str, items: int) -> None:
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id integer PRIMARY KEY, state text NOT NULL, owner text,"
            " token integer NOT NULL DEFAULT 0)"
        )
        cur.execute("CREATE INDEX IF NOT EXISTS jobs_pending ON jobs (id) WHERE state = 'pending'")
        cur.execute("TRUNCATE jobs")
        cur.execute(
            "INSERT INTO jobs (id, state) SELECT g, 'pending' FROM generate_series(1, %s) g", (items,)
        )
        cur.execute("ANALYZE jobs")
    conn.commit()
    conn.close()


def prepare_ledger(items: int) -> Any:
    """A fresh ledger database per run (the schema as migrations make it), ``items`` pending."""
    from onceflow.ledger import Ledger, create_ledger_engine

    url = postgres.create_database("bench_ledger")
    engine = create_ledger_engine(url, pool_size=70, max_overflow=10)
    ledger = Ledger(engine)
    ledger.add_many("job", [str(i) for i in range(1, items + 1)], batch=5000)
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE work_items")
    ledger.bench_url = url  # type: ignore[attr-defined]
    return ledger


def run(url: str, strategy: str, claimers: int, items: int, batch: int = 1) -> dict[str, Any]:
    ledger = prepare_ledger(items) if strategy in LEDGER_STRATEGIES else None
    if ledger is None:
        prepare_jobs(url, items)
    tallies = [Tally() for _ in range(claimers)]
    start = threading.Barrier(claimers + 1)
    threads = []
    for n, tally in enumerate(tallies):
        target, args = (
            (ledger_claimer, (ledger, strategy, batch, f"c{n}", tally, start))
            if ledger is not None
            else (sql_claimer, (url, strategy, f"c{n}", tally, start))
        )
        threads.append(threading.Thread(target=target, args=args, daemon=True))
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if ledger is not None:
        ledger.engine.dispose()
        postgres.drop_database(ledger.bench_url)
    processed = [job for t in tallies for job in t.processed]
    counts = Counter(processed)
    errors = sum((t.errors for t in tallies), Counter())
    return {
        "strategy": strategy,
        "claimers": claimers,
        "claims_per_s": len(processed) / elapsed,
        "seconds": elapsed,
        "distinct": len(counts),
        "duplicates": sum(c - 1 for c in counts.values()),
        "missed": items - len(counts),
        "deadlocks": sum(t.deadlocks for t in tallies),
        "empty": sum(t.empty for t in tallies),
        "errors": dict(errors),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate; duplicates, deadlocks and empty claims are the worst seen."""
    ordered = sorted(runs, key=lambda r: r["claims_per_s"])
    mid = dict(ordered[(len(ordered) - 1) // 2])
    for key in ("duplicates", "missed", "deadlocks", "empty"):
        mid[key] = max(r[key] for r in runs)
    return mid


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cpus)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000, help="jobs per run (default 2000)")
    parser.add_argument("--claimers", default="1,4,16,64", help="comma-separated claimer counts")
    parser.add_argument("--strategies", default=",".join(STRATEGIES + CLAIM_ONLY))
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is printed")
    parser.add_argument("--batch", type=int, default=16, help="items per ledger batch claim (default 16)")
    parser.add_argument(
        "--quick", action="store_true", help="300 items, 1,4,16 claimers, 1 run: a smoke test"
    )
    args = parser.parse_args()
    if args.quick:
        args.items, args.claimers, args.repeat = 300, "1,4,16", 1
    levels = [int(x) for x in args.claimers.split(",")]
    strategies = args.strategies.split(",")
    unknown = set(strategies) - set(STRATEGIES + CLAIM_ONLY)
    if unknown:
        parser.error(f"unknown strategies {sorted(unknown)}; choose from {STRATEGIES + CLAIM_ONLY}")

    url = postgres.create_database("bench_claims")
    results: list[dict[str, Any]] = []
    try:
        print(
            f"{args.items} jobs per run; one thread and one connection per claimer; strategies interleaved,"
            f" median of {args.repeat} run(s); ledger batch {args.batch}\n{load()}\n"
        )
        header = (
            f"{'strategy':<13}{'claimers':>9}{'claims/s':>11}{'seconds':>9}{'dups':>7}{'missed':>8}"
            f"{'deadlocks':>10}{'empty':>8}  errors"
        )
        print(header)
        print("-" * len(header))
        for n in levels:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in strategies}
            for _ in range(args.repeat):
                for strategy in strategies:
                    runs[strategy].append(run(url, strategy, n, args.items, args.batch))
            for strategy in strategies:
                r = median_run(runs[strategy])
                results.append(r)
                print(
                    f"{r['strategy']:<13}{r['claimers']:>9}{r['claims_per_s']:>11.0f}{r['seconds']:>9.2f}"
                    f"{r['duplicates']:>7}{r['missed']:>8}{r['deadlocks']:>10}{r['empty']:>8}  {r['errors'] or ''}",
                    flush=True,
                )
            print(f"  ({load()})", flush=True)
    finally:
        postgres.drop_database(url)

    by = {(r["strategy"], r["claimers"]): r for r in results}

    def ratio_line(base: str, other: str) -> None:
        cells = [
            f"{n}: {by[(base, n)]['claims_per_s'] / by[(other, n)]['claims_per_s']:.2f}x"
            for n in levels
            if (base, n) in by and (other, n) in by and by[(other, n)]["claims_per_s"]
        ]
        if cells:
            print(f"  {base} / {other:<13} " + "  ".join(cells))

    print(
        "\nratios (claims/s of the first over the second, same claimer count; above 1: the first is faster)"
    )
    for other in [s for s in STRATEGIES if s != "skip_locked"]:
        ratio_line("skip_locked", other)
    for other in ("ledger_claim", "ledger_batch"):
        ratio_line("bare_claim", other)
    if len(levels) > 1:
        lo, hi = levels[0], levels[-1]
        for s in strategies:
            if (s, lo) in by and (s, hi) in by:
                scale = by[(s, hi)]["claims_per_s"] / by[(s, lo)]["claims_per_s"]
                print(f"  {s:<13} {hi} claimers vs {lo}: {scale:.2f}x")
    print(f"\n{load()}")


if __name__ == "__main__":
    main()
