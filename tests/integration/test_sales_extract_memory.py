"""The extract's memory does not grow with the day: rows stream from a server-side cursor into
parquet row groups. Each size runs the real extract (``stream_interval`` into
``write_extract_stream``) in its own process over a real PostgreSQL shop; peak RSS is
``ru_maxrss`` of that process. Slow: three processes importing pandas and 250,000 rows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHILD = textwrap.dedent(
    """
    import datetime as dt, json, resource, sys
    import pandas, pyarrow.parquet as pq
    from onceflow.sales import staging
    from onceflow.sales.engine import make_source_engine
    from onceflow.sales.shop_query import stream_interval

    url, schema, folder = sys.argv[1:4]
    engine = make_source_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = dt.datetime(2024, 5, 6, tzinfo=dt.timezone.utc)
    with stream_interval(engine, start, start + dt.timedelta(days=1)) as (watermark, batches):
        _path, rows = staging.write_extract_stream(folder, batches, source_watermark_utc=watermark)
    staged = pq.ParquetFile(f"{folder}/extract.parquet").metadata.num_rows
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": rows, "staged": staged, "before_kb": before, "peak_kb": peak}))
    """
)


def make_shop(url: str, schema: str, rows: int) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        conn.exec_driver_sql(
            f"CREATE TABLE {schema}.orders (row_id bigint PRIMARY KEY, order_id text, event_type text,"
            " refund_id text, customer_id bigint, created_at_utc timestamptz, ingested_at_utc timestamptz,"
            " amount numeric(12,2), currency text)"
        )
        conn.exec_driver_sql(
            f"INSERT INTO {schema}.orders SELECT i, 'order-' || lpad(i::text, 12, '0'), 'sale', NULL,"
            " 1000000 + i, timestamptz '2024-05-06 00:00+00' + i * interval '1 ms',"
            " timestamptz '2024-05-06 00:00+00' + i * interval '1 ms' + interval '3 s',"
            f" mod(i, 9973) / 100.0 + 1, 'EUR' FROM generate_series(1, {rows}) i"
        )
    engine.dispose()


def extract_peak(url: str, schema: str, folder: Path) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, schema, str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_extracts_peak_memory_does_not_grow_with_the_days_rows(postgres_url: str, tmp_path: Path) -> None:
    peaks = {}
    for rows in (1, 50_000, 200_000):
        make_shop(postgres_url, f"shop_{rows}", rows)
        peaks[rows] = extract_peak(postgres_url, f"shop_{rows}", tmp_path / str(rows))
        assert peaks[rows]["rows"] == peaks[rows]["staged"] == rows  # every row staged
    # The work's own memory, above a one-row day (imports, pools, the parquet writer).
    grow_50k = peaks[50_000]["peak_kb"] - peaks[1]["peak_kb"]
    grow_200k = peaks[200_000]["peak_kb"] - peaks[1]["peak_kb"]
    print({k: v["peak_kb"] // 1024 for k, v in peaks.items()}, "MB peak")
    # Holding the day would make 200k about 4x 50k; streaming keeps it near 1x (batches of 50,000).
    assert grow_200k < 1.5 * grow_50k + 20 * 1024, peaks
