"""Cleaning's memory does not grow with the day: ``staging.clean_extract`` reads the staged extract
row group by row group and dedupes and nets bucket by bucket (``clean_stream.DayCleaner``). Each
size runs the real clean in its own process over an extract staged as the extract task stages it
(sales, a refund every 20th row, 2 % exact repeats, a conflicting sale every 500th); peak RSS is
``ru_maxrss`` of that process. Slow: three processes importing pandas and Airflow, 500,000 rows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.slow]

CHILD = textwrap.dedent(
    """
    import datetime as dt, json, resource, sys
    import numpy as np, pandas as pd
    from onceflow.sales import staging
    from onceflow.sales.clean import PROCESSING_VERSION

    rows, folder, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]

    def batches(n, size=50_000):
        t0 = np.datetime64("2024-10-26T22:00:00", "us")
        step = 25 * 3600 * 10**6 // max(n, 1)
        for s in range(0, n, size):
            i = np.arange(s, min(n, s + size))
            refund = i % 20 == 19
            repeat = i % 50 == 7  # an exact repeat of the sale before it
            conflict = i % 500 == 3  # the sale before it with another amount
            sale_no = np.where(refund | repeat | conflict, i - 1, i)
            text = lambda values: pd.Series(list(values), dtype=object)
            created = t0 + (sale_no * step).astype("timedelta64[us]")
            yield pd.DataFrame({
                "row_id": i + 1,
                "order_id": text("O%d" % k for k in sale_no),
                "event_type": text(np.where(refund, "refund", "sale").tolist()),
                "refund_id": text(("R%d" % k) if r else None for k, r in zip(i, refund)),
                "customer_id": text(None if k % 97 == 0 else "C%d" % (k % 50000) for k in sale_no),
                "created_at_utc": created,
                "ingested_at_utc": created + (i - sale_no + 5).astype("timedelta64[s]"),
                "amount": text("%.2f" % ((k * 7919 % 90000 + 100 + c) / 100) for k, c in zip(sale_no, conflict)),
                "currency": text(("EUR", "USD", "GBP", "SEK")[k % 4] for k in sale_no),
            })

    if mode == "stage":
        staging.write_extract_stream(folder, batches(rows), source_watermark_utc=dt.datetime(2024, 10, 28))
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        summary = staging.clean_extract(folder, partition=dt.date(2024, 10, 27), processing_version=PROCESSING_VERSION)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"summary": summary.__dict__, "before_kb": before, "peak_kb": peak}))
    """
)


def run(mode: str, rows: int, folder: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(rows), str(folder), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]) if mode == "clean" else {}


def test_the_cleans_peak_memory_does_not_grow_with_the_days_rows(tmp_path: Path) -> None:
    peaks: dict[int, dict[str, object]] = {}
    for rows in (1_000, 100_000, 500_000):
        folder = tmp_path / str(rows)
        run("stage", rows, folder)
        peaks[rows] = result = run("clean", rows, folder)
        summary = result["summary"]
        assert isinstance(summary, dict)
        assert summary["source_rows"] == rows
        assert summary["rejects"] == summary["reasons"]["conflicting_duplicate"] > 0
        assert summary["duplicates_dropped"] > 0
    mb = {k: int(v["peak_kb"]) // 1024 for k, v in peaks.items()}  # type: ignore[call-overload]
    print(mb, "MB peak")
    # The work's own memory, above a day of 1,000 rows (imports, the spill files' writers).
    grow_100k, grow_500k = mb[100_000] - mb[1_000], mb[500_000] - mb[1_000]
    # Holding the day would make 500k about 5x 100k (the old clean: 1.5 kB a row); bucket by
    # bucket keeps it near 1x.
    assert grow_500k < 1.5 * grow_100k + 40, mb
    assert mb[500_000] < 600, mb
