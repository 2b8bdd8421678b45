"""daily_sales at real sizes: each step's time and peak RSS, against a bare COPY and ``to_sql``.

For each size (default 100,000, 1,000,000 and 5,000,000 source rows of one day) the script fills a
throwaway PostgreSQL shop with that day's ``orders`` (in SQL: sales, 5 % refunds, 2 % exact
repeats; the shop's own ``orders`` definition), then runs the DAG's own step functions, **each in
its own process** so its peak RSS is its own:

* **extract**: :func:`onceflow.sales.shop_query.stream_interval` (a server-side cursor, batches
  of 50,000 rows) into :func:`onceflow.sales.staging.write_extract_stream` (parquet row groups);
* **clean**: :func:`onceflow.sales.staging.clean_extract` (row groups in, buckets spilled to local
  files, :mod:`onceflow.sales.clean_stream`);
* **load**: ``open_clean`` and :meth:`PartitionStore.overwrite` of the streamed Arrow batches
  (fence, delete, one COPY fed by a second thread that formats and checksums, rejects, audit,
  commit; a warehouse lease, as ``ledger_conn_id=None``), as ``PartitionOverwriteOperator`` does;
  the ratio to the bare COPY uses the fenced part (lease to commit), the step's wall adds the
  engine and the schema check;
* **bare COPY**: the same cleaned rows, already in COPY text in a file, ``COPY ... FROM STDIN``
  into an empty table with nothing else (only the COPY is timed);
* **to_sql**: ``DataFrame.to_sql`` of the same rows (skipped above ``--to-sql-max`` rows: it is
  ~65 s per million).

Each step prints wall seconds, CPU seconds and peak RSS (``ru_maxrss``; "imports" is the RSS
of a process that imported the same modules and did nothing, about what every step starts from).
The staging folder's size is printed after clean. The load and the bare COPY then run twice more,
alternating, and each pair's ratio is printed with the load average at that moment: the machine
may be shared, so read wall-clock ratios with it (and the spread between pairs).

Standalone: creates throwaway databases on the server and drops them afterwards::

    .venv/bin/python benchmarks/bench_partition_load.py [--sizes 100000,1000000,5000000] [--server-url URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

DAY = dt.date(2024, 10, 27)
TZ = "Europe/Amsterdam"
SIZES = (100_000, 1_000_000, 5_000_000)

# One day of orders in SQL: row i is a sale, every 20th a refund of the sale before it; 2 % of
# the sales are repeated exactly (ingested 30 s later). Event times spread over the 25-hour day.
FILL_SQL = """
INSERT INTO orders (order_id, event_type, refund_id, customer_id, created_at_utc, ingested_at_utc, amount, currency)
SELECT CASE WHEN i % 20 = 19 THEN 'O' || (i - 1) ELSE 'O' || i END,
       CASE WHEN i % 20 = 19 THEN 'refund' ELSE 'sale' END,
       CASE WHEN i % 20 = 19 THEN 'R' || i END,
       'C' || (i % 50000),
       t, t + interval '5 seconds',
       (((i::bigint * 7919) % 90000 + 100)::numeric / 100)::numeric(12, 2)::text,
       (ARRAY['EUR', 'USD', 'GBP', 'SEK'])[1 + i % 4]
FROM (SELECT i, TIMESTAMP '2024-10-26 22:00:00' + (i::float8 / :n) * interval '25 hours' AS t
      FROM generate_series(0, :n - 1) AS i) s;
INSERT INTO orders (order_id, event_type, refund_id, customer_id, created_at_utc, ingested_at_utc, amount, currency)
SELECT order_id, event_type, refund_id, customer_id, created_at_utc, ingested_at_utc + interval '30 seconds',
       amount, currency
FROM orders WHERE event_type = 'sale' AND row_id % 50 = 7;
"""


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _interval() -> tuple[dt.datetime, dt.datetime]:
    from onceflow.sales.partitions import day_bounds_utc

    return day_bounds_utc(DAY, TZ)


def step(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one step in this process; returns its measurements."""
    import pandas as pd  # noqa: F401  (every step imports it; "imports" measures the same)
    from airflow.sdk import ObjectStoragePath  # noqa: F401  (staging paths; a task process has it)

    from onceflow.sales import staging
    from onceflow.sales.clean_rules import PROCESSING_VERSION
    from onceflow.sales.engine import make_engine, make_source_engine
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.sales.shop_query import stream_interval

    folder = Path(args.folder)
    out: dict[str, Any] = {}
    cpu0, t0 = _cpu(), time.perf_counter()
    if name == "imports":
        pass
    elif name == "extract":
        engine = make_source_engine(args.shop)
        # as the DAG's extract task: a server-side cursor into parquet row groups
        with stream_interval(engine, *_interval()) as (watermark, batches):
            _path, out["rows"] = staging.write_extract_stream(folder, batches, source_watermark_utc=watermark)
        engine.dispose()
    elif name == "clean":
        # as the DAG's clean task: row group by row group, bucket by bucket
        out["rows"] = staging.clean_extract(folder, partition=DAY, processing_version=PROCESSING_VERSION).rows
        out["staging_mb"] = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
    elif name == "load":
        engine = make_engine(args.warehouse)
        store = PartitionStore(engine, "daily_sales")
        store.create_schema()
        fenced0 = time.perf_counter()  # from the fence token to the commit: what the ratio compares
        lease = store.acquire_lease(DAY, run_id=f"bench-{uuid.uuid4().hex[:6]}", try_number=1)
        with staging.open_clean(folder) as staged:  # as PartitionOverwriteOperator: Arrow batches stream
            audit = store.overwrite(
                lease, staged.arrow_batches(), staged.rejects, processing_version=staged.processing_version,
                source_watermark_utc=staged.source_watermark_utc, duplicate_count=staged.duplicates_dropped,
            )  # fmt: skip
        out["fenced_s"] = time.perf_counter() - fenced0
        out["rows"] = audit.row_count
        engine.dispose()
    elif name in ("bare_copy", "to_sql"):
        out.update(_baseline(name, args, folder))
        return out
    else:
        raise SystemExit(f"unknown step {name!r}")
    out["wall_s"], out["cpu_s"], out["peak_mb"] = time.perf_counter() - t0, _cpu() - cpu0, _peak_mb()
    return out


def _baseline(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """A bare COPY of the cleaned rows (text prepared untimed) or ``to_sql`` of them, into a new table."""
    import sqlalchemy as sa

    from onceflow.sales.bulk_load import arrow_copy_text, copy_statement
    from onceflow.sales.schema import SALES_COLUMNS, sales_table
    from onceflow.sales.staging import open_clean, read_clean

    engine = sa.create_engine(args.warehouse)
    table = sales_table(f"bench_{name}_{uuid.uuid4().hex[:6]}", sa.MetaData())
    table.create(engine)
    try:
        if name == "bare_copy":
            text_file = folder / "bare_copy.txt"
            with text_file.open("wb") as fh, open_clean(folder) as staged:  # untimed, batch by batch
                for batch in staged.arrow_batches():
                    fh.write(arrow_copy_text(batch) or b"")
            raw = engine.raw_connection()
            try:
                cpu0, t0 = _cpu(), time.perf_counter()
                with text_file.open() as fh, raw.cursor() as cur:
                    cur.copy_expert(copy_statement(table.name), fh)
                raw.commit()
                wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
            finally:
                raw.close()
                text_file.unlink()
        else:
            rows = read_clean(folder).rows
            cpu0, t0 = _cpu(), time.perf_counter()
            with engine.begin() as conn:
                rows.loc[:, list(SALES_COLUMNS)].to_sql(
                    table.name, conn, if_exists="append", index=False, chunksize=10_000
                )
            wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    finally:
        table.drop(engine)
        engine.dispose()
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": _peak_mb()}


def _in_child(name: str, shop: str, warehouse: str, folder: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--step",
        name,
        "--shop",
        shop,
        "--warehouse",
        warehouse,
        "--folder",
        str(folder),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"step {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def run_size(server_url: str, rows: int, to_sql_max: int) -> None:
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    from onceflow.sales.schema import shop_metadata

    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    names = {k: f"onceflow_bench_{k}_{uuid.uuid4().hex[:8]}" for k in ("shop", "warehouse")}
    with admin.connect() as conn:
        for name in names.values():
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    urls = {
        k: make_url(server_url).set(database=v).render_as_string(hide_password=False)
        for k, v in names.items()
    }
    folder = Path(tempfile.mkdtemp(prefix="onceflow-bench-"))
    try:
        shop = sa.create_engine(urls["shop"])
        shop_metadata.create_all(shop)
        with shop.begin() as conn:
            for statement in FILL_SQL.split(";"):
                if statement.strip():
                    conn.execute(sa.text(statement), {"n": rows})
            conn.exec_driver_sql("ANALYZE orders")
            source = conn.exec_driver_sql("SELECT count(*) FROM orders").scalar_one()
        shop.dispose()
        print(f"\n== {rows:,} generated rows ({source:,} source rows with repeats); load average {_load()}")
        print(f"{'step':<10} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}  note", flush=True)
        results: dict[str, dict[str, Any]] = {}
        steps = ["imports", "extract", "clean", "load", "bare_copy"]
        steps += ["to_sql"] if rows <= to_sql_max else []
        for name in steps:
            results[name] = r = _in_child(name, urls["shop"], urls["warehouse"], folder)
            note = f"{r['rows']:,} rows" if "rows" in r else ""
            if "fenced_s" in r:
                note += f", lease to commit {r['fenced_s']:.2f} s"
            if "staging_mb" in r:
                note += f", staging folder {r['staging_mb']:.1f} MB"
            print(
                f"{name:<10} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {r['peak_mb']:>8.0f}  {note}", flush=True
            )
        copy = results["bare_copy"]["wall_s"]
        over = [n for n in ("extract", "clean", "load") if results[n]["peak_mb"] >= 600]
        # Load and bare COPY again, alternating, each pair under the same load average: one
        # ratio per pair, so a busy machine shows as spread rather than as one skewed figure. The
        # load's time here is the fenced part (lease, delete, COPY, checksum, rejects, audit,
        # commit); the step's wall above adds the engine and the schema check.
        pairs = [(results["load"]["fenced_s"], copy, _load())]
        for _ in range(2):
            load_s = _in_child("load", urls["shop"], urls["warehouse"], folder)["fenced_s"]
            copy_s = _in_child("bare_copy", urls["shop"], urls["warehouse"], folder)["wall_s"]
            pairs.append((load_s, copy_s, _load()))
        for load_s, copy_s, load_avg in pairs:
            print(
                f"load {load_s:.2f} s / bare COPY {copy_s:.2f} s = {load_s / copy_s:.2f}x wall "
                f"(load average {load_avg})"
            )
        print(f"load process CPU: {results['load']['cpu_s']:.1f} s")
        if "to_sql" in results:
            print(f"to_sql / bare COPY: {results['to_sql']['wall_s'] / copy:.1f}x wall")
        print(f"steps at or over 600 MB peak RSS: {', '.join(over) or 'none'}; load average after {_load()}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with admin.connect() as conn:
            for name in names.values():
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated row counts")
    parser.add_argument("--rows", type=int, help="one size only (as make bench runs it)")
    parser.add_argument("--quick", action="store_true", help="100,000 rows only")
    parser.add_argument("--to-sql-max", type=int, default=1_000_000, help="skip to_sql above this many rows")
    parser.add_argument("--server-url", default="postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--shop", help=argparse.SUPPRESS)
    parser.add_argument("--warehouse", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(args.step, args)))
        return
    sizes = (
        [100_000]
        if args.quick
        else [args.rows]
        if args.rows
        else [int(s) for s in args.sizes.split(",") if s]
    )
    print("daily_sales steps on PostgreSQL, each step in its own process (peak RSS = ru_maxrss)")
    for rows in sizes:
        run_size(args.server_url, rows, args.to_sql_max)


if __name__ == "__main__":
    main()
