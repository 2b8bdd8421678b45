"""Rows per second loading one partition of 1,000,000 rows into PostgreSQL, by load method.

Runs the real :meth:`PartitionStore.overwrite` (lease, fence check, delete, insert, rejects,
audit, commit) once per method into its own table, and times the insert phase (between the
``deleted`` and ``rows_written`` checkpoints) and the whole transaction. Methods:

* ``copy``: ``COPY ... FROM STDIN`` (psycopg2 ``copy_expert``), the default on PostgreSQL;
* ``to_sql``: ``pandas.DataFrame.to_sql`` on the same SQLAlchemy connection;
* ``insert``: SQLAlchemy Core ``insert()`` with a list of rows (batched "insertmanyvalues");
* ``executemany``: the DBAPI ``cursor.executemany`` with one parameter tuple per row.

Standalone: creates a throwaway database on the server and drops it afterwards::

    .venv/bin/python benchmarks/bench_partition_load.py [--rows 1000000] [--server-url URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
import uuid

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from onceflow.sales.clean import normalise_sales_frame
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore

DAY = dt.date(2024, 10, 27)
METHODS = ("copy", "to_sql", "insert", "executemany")


def build_rows(n: int) -> pd.DataFrame:
    """``n`` deterministic sales rows of one partition (seeded, no clock)."""
    rng = np.random.default_rng(20241027)
    gross = rng.integers(100, 90_000, n)
    refund = np.where(rng.random(n) < 0.05, gross // 2, 0)
    start = np.datetime64("2024-10-26T22:00:00", "us")
    frame = pd.DataFrame(
        {
            "partition_date": [DAY] * n,
            "order_id": [f"O20241027-{i:07d}" for i in range(n)],
            "customer_id": [f"C{c:05d}" for c in rng.integers(1, 50_000, n)],
            "source_currency": rng.choice(["EUR", "USD", "GBP", "SEK"], n),
            "gross_cents": gross,
            "refund_cents": refund,
            "net_cents": gross - refund,
            "event_count": np.where(refund > 0, 2, 1),
            "first_event_utc": start + rng.integers(0, 25 * 3600 * 10**6, n).astype("timedelta64[us]"),
        }
    )
    return normalise_sales_frame(frame)


def run(server_url: str, rows: int, methods: tuple[str, ...]) -> None:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"onceflow_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        frame = build_rows(rows)
        print(f"PostgreSQL partition load, {rows:,} rows, database {name}")
        print(f"{'method':<12} {'insert s':>9} {'rows/s':>12} {'txn s':>8} {'vs copy':>8}")
        results: dict[str, float] = {}
        for method in methods:
            engine = make_engine(url)
            store = PartitionStore(engine, f"bench_{method}")
            store.create_schema()
            marks: dict[str, float] = {}
            lease = store.acquire_lease(DAY, run_id="bench", try_number=1)
            t0 = time.perf_counter()
            store.overwrite(
                lease,
                frame,
                None,
                processing_version="bench",
                method=method,  # type: ignore[arg-type]
                checkpoint=lambda stage, marks=marks: marks.__setitem__(stage, time.perf_counter()),
            )
            total = time.perf_counter() - t0
            insert = marks["rows_written"] - marks["deleted"]
            assert len(store.partition_rows(DAY)) == rows
            results[method] = rows / insert
            ratio = results[method] / results.get("copy", results[method])
            print(f"{method:<12} {insert:>9.2f} {rows / insert:>12,.0f} {total:>8.2f} {ratio:>7.2f}x")
            engine.dispose()
        if "copy" in results:
            print("ratios (copy rows/s divided by method rows/s):")
            for method, speed in results.items():
                if method != "copy":
                    print(f"  copy / {method}: {results['copy'] / speed:.1f}x")
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--server-url", default="postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS)
    )
    args = parser.parse_args()
    run(args.server_url, args.rows, tuple(m for m in args.methods.split(",") if m))


if __name__ == "__main__":
    main()
