"""A day staged as text against the same day staged as parquet: CPU of extract, clean and load.

For each size (source rows of one day; default 100, 1,000, 5,000, 10,000 and 20,000) the script
generates a messy day (``onceflow.testing.sales_fixtures.messy_day``: repeats, conflicts, refunds,
NULLs, malformed rows) and runs the DAG's own step functions on it in this process, each side in
turn, as the tasks do: :func:`onceflow.sales.staging.write_extract_stream` of the shop query's batch,
:func:`~onceflow.sales.staging.clean_extract`, then ``open_clean`` and
:meth:`PartitionStore.overwrite` into a SQLite warehouse (INSERT; a warehouse lease). Side
``text`` has ``ONCEFLOW_SALES_TEXT_ROWS`` above the size, side ``parquet`` has it at 0. Each side's
value is the CPU seconds (``time.process_time``) of the three steps, in a process that has already
imported everything: what a task costs where the scheduler preloads pyarrow (``onceflow.preload``).

Where nothing is preloaded, a parquet day's tasks also pay the imports the text day never makes:
``pyarrow`` (with numpy), ``pyarrow.parquet`` and ``pyarrow.compute``, measured in fresh processes
(after ``import airflow.sdk``, as in a task) and printed once, per task and per run (three tasks).
``ONCEFLOW_SALES_TEXT_ROWS`` (default 10,000) is where text stops paying: below it, text costs
less than parquet's imports; above it the per-row cost of text grows past them.

Run: ``.venv/bin/python benchmarks/bench_staging_formats.py [--sizes 100,1000,10000] [--repeat 3]``
on an idle machine (the load average is printed with every repetition).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "providers"))

from sidebyside import Result, load_average, measure_sides, print_table  # noqa: E402

DAY = dt.date(2024, 10, 27)
IMPORTS = "import pyarrow, pyarrow.parquet, pyarrow.compute"


def import_cpu(repeat: int) -> float:
    """Median CPU seconds of the imports a parquet day's task makes and a text day's does not."""
    code = f"import time, airflow.sdk\nt = time.process_time(); {IMPORTS}; print(time.process_time() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(repeat)
    ]
    return statistics.median(runs)


def day_cpu(columns: dict[str, list[object]], limit: str, work: Path) -> float:
    """CPU seconds of extract, clean and load of one day staged with ``ONCEFLOW_SALES_TEXT_ROWS=limit``."""
    from onceflow.sales import staging
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.sales.text_staging import TEXT_ROWS_ENV

    os.environ[TEXT_ROWS_ENV] = limit
    folder = Path(tempfile.mkdtemp(dir=work))
    store = PartitionStore(make_engine(f"sqlite:///{folder / 'warehouse.db'}"), "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="bench", try_number=1)
    start = time.process_time()
    staging.write_extract_stream(folder / "stage", [columns], source_watermark_utc=dt.datetime(2024, 10, 28))
    staging.clean_extract(folder / "stage", partition=DAY, processing_version="v")
    with staging.open_clean(folder / "stage") as staged:
        store.overwrite(
            lease,
            staged.load_batches(),
            staged.reject_load_batches(),
            processing_version=staged.processing_version,
            source_watermark_utc=staged.source_watermark_utc,
            duplicate_count=staged.duplicates_dropped,
        )
    spent = time.process_time() - start
    store.engine.dispose()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000,10000,20000", help="source rows per day")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from onceflow.testing.sales_fixtures import messy_day, order_columns

    print(f"load average at start {load_average()}; {os.cpu_count()} CPUs", flush=True)
    imports = import_cpu(args.repeat)
    print(
        f"imports a parquet day's task makes and a text day's does not ({IMPORTS}): {imports:.3f} s CPU "
        f"per task, {3 * imports:.3f} s per run (three tasks), median of {args.repeat} fresh processes",
        flush=True,
    )
    summary = []
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-formats-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            orders = max(1, size * 2 // 3)  # messy_day adds repeats, refunds and conflicts to the orders
            frame = messy_day(DAY, 1, orders)
            columns = order_columns(frame)
            rows = len(columns["row_id"])
            print(f"\n{rows} source rows ({orders} orders):", flush=True)
            text_limit = str(max(rows, 1))
            samples = measure_sides(
                {
                    "parquet": lambda _rep, c=columns: Result(day_cpu(c, "0", Path(tmp))),
                    "text": lambda _rep, c=columns, n=text_limit: Result(day_cpu(c, n, Path(tmp))),
                },
                args.repeat,
            )
            med = print_table(samples, baseline="parquet", unit="CPU s per run, preloaded process")
            summary.append((rows, med["parquet"], med["text"]))
    print(f"\nsummary (medians; without the preload a parquet run also pays {3 * imports:.3f} s of imports):")
    print(f"{'rows':>8} {'parquet':>9} {'text':>9} {'text - parquet':>15} {'… no preload':>13}")
    for rows, parquet, text in summary:
        print(
            f"{rows:>8} {parquet:>9.3f} {text:>9.3f} {text - parquet:>+15.3f} {text - parquet - 3 * imports:>+13.3f}"
        )


if __name__ == "__main__":
    main()
