"""Loading one partition of 1,000,000 rows into PostgreSQL, by load method: insert phase and whole overwrite.

Runs the real :meth:`PartitionStore.overwrite` (fence check, delete, insert, rejects, audit,
commit) per method into its own table, ``--repeat`` times each, and reports the median of

* **insert s**: the insert phase (between the ``deleted`` and ``rows_written`` checkpoints,
  inside the overwrite's transaction) and its rows per second;
* **overwrite s**: the whole ``overwrite()`` call end to end (CSV or parameter building, the
  checksum, the fence check, delete, insert, audit row, commit).

Methods:

* ``copy``: ``COPY ... FROM STDIN`` (psycopg2 ``copy_expert``), the default on PostgreSQL;
* ``to_sql``: ``pandas.DataFrame.to_sql`` on the same SQLAlchemy connection;
* ``insert``: SQLAlchemy Core ``insert()`` with a list of rows (batched "insertmanyvalues");
* ``execute_values``: ``psycopg2.extras.execute_values`` (multi-row ``VALUES`` pages of 1,000),
  the fast way to send an executemany from Python; the plain DBAPI ``cursor.executemany``
  sends one statement per row and is slower still.

The rows are deterministic and include NULL and empty-string ``customer_id`` values (the two must
stay different); after each load the partition is read back and its checksum compared with the
frame's, so a method that loses the difference fails the benchmark.

Standalone: creates a throwaway database on the server and drops it afterwards::

    .venv/bin/python benchmarks/bench_partition_load.py [--rows 1000000] [--repeat 3] [--server-url URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from onceflow.sales import partition_store
from onceflow.sales.bulk_load import frame_records, insert_rows
from onceflow.sales.checksum import frame_checksum
from onceflow.sales.clean import normalise_sales_frame
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.schema import SALES_COLUMNS

DAY = dt.date(2024, 10, 27)
METHODS = ("copy", "to_sql", "insert", "execute_values")


def build_rows(n: int) -> pd.DataFrame:
    """``n`` deterministic sales rows of one partition (seeded, no clock), some with NULL or "" customers."""
    rng = np.random.default_rng(20241027)
    gross = rng.integers(100, 90_000, n)
    refund = np.where(rng.random(n) < 0.05, gross // 2, 0)
    start = np.datetime64("2024-10-26T22:00:00", "us")
    customers: list[str | None] = [f"C{c:05d}" for c in rng.integers(1, 50_000, n)]
    for i in range(0, n, 20):
        customers[i] = None  # 5 % unknown customers
    for i in range(10, n, 20):
        customers[i] = ""  # 5 % given as an empty string: must not become NULL
    frame = pd.DataFrame(
        {
            "partition_date": [DAY] * n,
            "order_id": [f"O20241027-{i:07d}" for i in range(n)],
            "customer_id": customers,
            "source_currency": rng.choice(["EUR", "USD", "GBP", "SEK"], n),
            "gross_cents": gross,
            "refund_cents": refund,
            "net_cents": gross - refund,
            "event_count": np.where(refund > 0, 2, 1),
            "first_event_utc": start + rng.integers(0, 25 * 3600 * 10**6, n).astype("timedelta64[us]"),
        }
    )
    return normalise_sales_frame(frame)


def _insert_with_execute_values(conn: Any, table: sa.Table, rows: pd.DataFrame, method: str) -> None:
    """``insert_rows`` plus the ``execute_values`` baseline, inside the same overwrite transaction."""
    if method != "execute_values":
        insert_rows(conn, table, rows, method)  # type: ignore[arg-type]
        return
    from psycopg2.extras import execute_values

    quoted = conn.dialect.identifier_preparer.format_table(table)
    sql = f"INSERT INTO {quoted} ({', '.join(SALES_COLUMNS)}) VALUES %s"
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        execute_values(cursor, sql, frame_records(rows, SALES_COLUMNS), page_size=1000)
    finally:
        cursor.close()


def load_once(url: str, method: str, frame: pd.DataFrame, expected: str, attempt: int) -> tuple[float, float]:
    """One real overwrite of the partition; returns (insert phase s, whole overwrite s)."""
    engine = make_engine(url)
    try:
        store = PartitionStore(engine, f"bench_{method}")
        store.create_schema()
        marks: dict[str, float] = {}
        lease = store.acquire_lease(DAY, run_id="bench", try_number=attempt)
        t0 = time.perf_counter()
        store.overwrite(
            lease,
            frame,
            None,
            processing_version="bench",
            method=method,  # type: ignore[arg-type]
            checkpoint=lambda stage: marks.__setitem__(stage, time.perf_counter()),
        )
        total = time.perf_counter() - t0
        stored = store.partition_checksum(DAY)
        if stored != expected:
            raise SystemExit(f"{method}: the rows read back differ from the frame (checksum {stored})")
        return marks["rows_written"] - marks["deleted"], total
    finally:
        engine.dispose()


def run(server_url: str, rows: int, methods: tuple[str, ...], repeat: int) -> None:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"onceflow_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    # The overwrite calls insert_rows by the name partition_store imported; add the baseline there.
    partition_store.insert_rows = _insert_with_execute_values  # type: ignore[assignment]
    try:
        frame = build_rows(rows)
        expected = frame_checksum(frame, SALES_COLUMNS)
        load_before = os.getloadavg()
        print(f"PostgreSQL partition load, {rows:,} rows (5 % NULL, 5 % empty customer ids), database {name}")
        print(f"median of {repeat} runs per method; load average before: {_load(load_before)}")
        print(f"{'method':<15} {'insert s':>9} {'rows/s':>11} {'overwrite s':>12} {'COPY faster by':>15}")
        results: dict[str, tuple[float, float]] = {}
        for method in methods:
            samples = [load_once(url, method, frame, expected, attempt + 1) for attempt in range(repeat)]
            insert = statistics.median(s[0] for s in samples)
            total = statistics.median(s[1] for s in samples)
            results[method] = (insert, total)
            base = results.get("copy", (insert, total))
            print(
                f"{method:<15} {insert:>9.2f} {rows / insert:>11,.0f} {total:>12.2f} "
                f"{insert / base[0]:>6.1f}x / {total / base[1]:.1f}x",
                flush=True,
            )
        print(f"load average after: {_load(os.getloadavg())}  (1, 5, 15 minutes)")
        print("'COPY faster by': insert phase / whole overwrite, each against COPY's")
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _load(avg: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.1f}" for v in avg)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the median is reported")
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 2 runs per method")
    parser.add_argument("--server-url", default="postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS)
    )
    args = parser.parse_args()
    rows, repeat = (100_000, 2) if args.quick else (args.rows, args.repeat)
    unknown = set(args.methods.split(",")) - set(METHODS) - {""}
    if unknown:
        sys.exit(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    run(args.server_url, rows, tuple(m for m in args.methods.split(",") if m), repeat)


if __name__ == "__main__":
    main()
