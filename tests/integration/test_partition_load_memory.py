"""The load's memory does not grow with the day: ``open_clean`` streams ``rows.parquet`` (no
pre-buffering), one COPY takes Arrow batches, and the checksum keeps 32 bytes a row up to
``checksum.SPILL_ROWS`` and spills sorted runs past it. Each size loads staged rows into a real
PostgreSQL warehouse in its own process, as ``PartitionOverwriteOperator`` does; peak RSS is
``ru_maxrss`` of that process. Slow: three processes and 1.5 million rows loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHILD = textwrap.dedent(
    """
    import datetime as dt, json, resource, sys
    import numpy as np, pandas as pd
    from onceflow.sales import staging
    from onceflow.sales.clean import CleanResult, normalise_sales_frame
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.sales.schema import REJECT_COLUMNS

    url, schema, folder, rows, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    day = dt.date(2024, 10, 27)
    if mode == "stage":  # random values: the staged file is about as large as real rows make it
        rng = np.random.default_rng(rows)
        i = np.arange(rows)
        gross = rng.integers(100, 10**6, rows)
        frame = normalise_sales_frame(pd.DataFrame({
            "partition_date": [day] * rows,
            "order_id": pd.Series(["O%d-%x" % (k, v) for k, v in zip(i, rng.integers(0, 2**60, rows))], dtype=object),
            "customer_id": pd.Series([None if v % 20 == 0 else "C%d" % v for v in rng.integers(0, 10**9, rows)], dtype=object),
            "source_currency": rng.choice(["EUR", "USD", "GBP", "SEK"], rows), "gross_cents": gross,
            "refund_cents": gross // 7, "net_cents": gross - gross // 7, "event_count": rng.integers(1, 4, rows),
            "first_event_utc": np.datetime64("2024-10-26T22:00:00", "us")
            + rng.integers(0, 25 * 3600 * 10**6, rows).astype("timedelta64[us]"),
        }))
        rejects = pd.DataFrame({c: [] for c in REJECT_COLUMNS}).astype({"source_row_id": "int64"})
        staging.write_clean(folder, CleanResult(frame, rejects, rows, 0), partition=day, processing_version="v")
    else:
        from onceflow.sales import checksum

        checksum.SPILL_ROWS = 200_000  # the digests' share small, so what else grows shows
        engine = make_engine(url, connect_args={"options": f"-csearch_path={schema}"})
        store = PartitionStore(engine, "daily_sales")
        store.create_schema()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        lease = store.acquire_lease(day, run_id="r", try_number=1)
        with staging.open_clean(folder) as staged:
            audit = store.overwrite(lease, staged.arrow_batches(), staged.rejects, processing_version="v")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ok = audit.checksum == store.partition_checksum(day) if rows <= 100_000 else True
        print(json.dumps({"rows": audit.row_count, "ok": ok, "before_kb": before, "peak_kb": peak}))
    """
)


def run(url: str, schema: str, folder: Path, rows: int, mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, schema, str(folder), str(rows), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]) if mode == "load" else {}


def test_the_loads_peak_memory_does_not_grow_with_the_days_rows(postgres_url: str, tmp_path: Path) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    peaks: dict[int, dict[str, object]] = {}
    for rows in (1_000, 100_000, 1_500_000):
        schema = f"load_{rows}"
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        run(postgres_url, schema, tmp_path / str(rows), rows, "stage")
        peaks[rows] = result = run(postgres_url, schema, tmp_path / str(rows), rows, "load")
        assert result["rows"] == rows and result["ok"]
    engine.dispose()
    mb = {k: int(v["peak_kb"]) // 1024 for k, v in peaks.items()}  # type: ignore[call-overload]
    print(mb, "MB peak")
    # Above a day of 1,000 rows: a few batches, the digests of up to SPILL_ROWS rows (200,000 here:
    # 6 MB) and their sort. Holding the day, or pyarrow pre-buffering the file (its default: every
    # column chunk read stays cached, 70 MB here), grows with 15x the rows.
    grow_100k, grow_1500k = mb[100_000] - mb[1_000], mb[1_500_000] - mb[1_000]
    assert grow_1500k < grow_100k + 40, mb
    assert mb[1_500_000] < 600, mb
