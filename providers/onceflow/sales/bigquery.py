"""BigQuery partition overwrite: one WRITE_TRUNCATE load job into ``table$YYYYMMDD``.

BigQuery has no multi-statement transaction around a load job, but it does not need one here: a
load job with ``writeDisposition=WRITE_TRUNCATE`` whose destination carries the partition decorator
replaces exactly that partition when it succeeds and changes nothing when it fails. The client
comes from providers-google's ``BigQueryHook`` (see :mod:`onceflow.hooks.warehouse`).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from typing import TYPE_CHECKING, Any

from onceflow.sales.bulk_load import frame_records
from onceflow.sales.partitions import InvalidNameError, bigquery_decorator
from onceflow.sales.schema import SALES_COLUMNS

if TYPE_CHECKING:
    import pandas as pd
    from google.cloud.bigquery import Client

_DATASET_RE = re.compile(r"^[A-Za-z0-9_]{1,1024}$")
# BigQuery types of the sales columns, in SALES_COLUMNS order.
BIGQUERY_TYPES: dict[str, str] = {
    "partition_date": "DATE",
    "order_id": "STRING",
    "customer_id": "STRING",
    "source_currency": "STRING",
    "gross_cents": "INT64",
    "refund_cents": "INT64",
    "net_cents": "INT64",
    "event_count": "INT64",
    "first_event_utc": "TIMESTAMP",
}


def ndjson(rows: pd.DataFrame) -> bytes:
    """The rows as newline-delimited JSON, one object per row, keys in column order."""
    lines = []
    for rec in frame_records(rows, SALES_COLUMNS):
        obj: dict[str, Any] = {}
        for name, value in zip(SALES_COLUMNS, rec, strict=True):
            if isinstance(value, dt.datetime):
                value = value.isoformat(sep=" ", timespec="microseconds") + " UTC"
            elif isinstance(value, dt.date):
                value = value.isoformat()
            obj[name] = value
        lines.append(json.dumps(obj, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode() if lines else b""


def load_partition(
    client: Client, *, dataset: str, table: str, partition: dt.date, rows: pd.DataFrame
) -> dict[str, Any]:
    """Run the WRITE_TRUNCATE load job for one partition and wait for it.

    :param client: a ``google.cloud.bigquery.Client`` (from ``BigQueryHook.get_client``).
    :param dataset: dataset id (letters, digits, underscore).
    :param table: table id; the decorator ``$YYYYMMDD`` is added here.
    :param partition: the day to replace.
    :param rows: sales rows of that day.
    :return: job id, final state, destination and output rows of the finished job.
    """
    from google.cloud import bigquery

    if not _DATASET_RE.fullmatch(dataset):
        raise InvalidNameError(f"refusing BigQuery dataset {dataset!r}: letters, digits and underscore only")
    destination = f"{client.project}.{dataset}.{bigquery_decorator(table, partition)}"
    job_config = bigquery.LoadJobConfig(
        source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
        write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
        create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
        schema=[
            bigquery.SchemaField(
                name, BIGQUERY_TYPES[name], mode="NULLABLE" if name == "customer_id" else "REQUIRED"
            )
            for name in SALES_COLUMNS
        ],
        time_partitioning=bigquery.TimePartitioning(
            type_=bigquery.TimePartitioningType.DAY, field="partition_date"
        ),
    )
    data = ndjson(rows)
    job = client.load_table_from_file(io.BytesIO(data), destination, job_config=job_config, size=len(data))
    job.result()
    return {
        "job_id": job.job_id,
        "state": job.state,
        "destination": destination,
        "output_rows": job.output_rows,
    }
