"""BigQuery partition overwrite, fenced at the sink.

A load job cannot check anything before it truncates, so the partition is swapped in two jobs:

1. a **load job** writes the rows (newline-delimited JSON) into a staging table of this attempt,
   ``<table>__onceflow_stage_<YYYYMMDD>_t<token>`` (``WRITE_TRUNCATE``);
2. one **multi-statement transaction** (a query job running :data:`SWAP_SCRIPT`) reads the
   partition's row in the fence table ``onceflow_load_fence`` of the dataset, raises if a newer
   fence token committed there or a newer extract did, else deletes the partition, inserts the
   staged rows, records this token and watermark in the fence table, and commits; then it drops
   the staging table.

BigQuery commits the transaction whole or not at all, and aborts one of two transactions that
change the same table at once, so a stalled attempt that wakes after a newer attempt committed
is refused by BigQuery itself (:class:`~onceflow.sales.fencing.StaleAttemptError`), not by a
check made before its job. The SQL audit (``load_audit``) is committed after the swap, fenced by
the same token. The client comes from providers-google's ``BigQueryHook``
(:mod:`onceflow.hooks.warehouse`).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from onceflow.sales.bulk_load import frame_records
from onceflow.sales.fencing import OlderExtractError, StaleAttemptError
from onceflow.sales.partitions import InvalidNameError, partition_key, validate_table_name
from onceflow.sales.schema import SALES_COLUMNS

if TYPE_CHECKING:
    import pandas as pd
    from google.cloud.bigquery import Client

    from onceflow.sales.fencing import Lease

_log = logging.getLogger(__name__)
_DATASET_RE = re.compile(r"^[A-Za-z0-9_]{1,1024}$")
FENCE_TABLE = "onceflow_load_fence"
STALE_MARKER = "onceflow-stale-attempt"
OLDER_MARKER = "onceflow-older-extract"
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

#: The swap transaction. The first line names the tables for readers of the job history (and for
#: ``onceflow.testing.bigquery_stub``, which models this script); values are query parameters.
SWAP_SCRIPT = """-- onceflow:partition_swap target={target} staging={staging} fence={fence}
DECLARE newest_token INT64;
DECLARE newest_watermark TIMESTAMP;
CREATE TABLE IF NOT EXISTS `{fence}` (
  table_name STRING NOT NULL, partition_key STRING NOT NULL, committed_token INT64 NOT NULL,
  source_watermark_utc TIMESTAMP, run_id STRING NOT NULL, try_number INT64 NOT NULL,
  updated_at TIMESTAMP NOT NULL);
CREATE TABLE IF NOT EXISTS `{target}` ({columns}) PARTITION BY partition_date;
BEGIN TRANSACTION;
SET (newest_token, newest_watermark) = (
  SELECT AS STRUCT MAX(committed_token), MAX(source_watermark_utc) FROM `{fence}`
  WHERE table_name = @table_name AND partition_key = @partition_key);
IF newest_token > @fence_token THEN
  RAISE USING MESSAGE = FORMAT('{stale}: fence token %d committed, this attempt holds %d',
                               newest_token, @fence_token);
END IF;
IF newest_watermark > @source_watermark_utc
   OR (newest_watermark IS NOT NULL AND @source_watermark_utc IS NULL) THEN
  RAISE USING MESSAGE = FORMAT('{older}: the partition holds an extract read at %t', newest_watermark);
END IF;
DELETE FROM `{target}` WHERE partition_date = @day;
INSERT INTO `{target}` ({names}) SELECT {names} FROM `{staging}`;
MERGE `{fence}` f
USING (SELECT @table_name AS table_name, @partition_key AS partition_key) s
ON f.table_name = s.table_name AND f.partition_key = s.partition_key
WHEN MATCHED THEN UPDATE SET committed_token = @fence_token, source_watermark_utc = @source_watermark_utc,
  run_id = @run_id, try_number = @try_number, updated_at = CURRENT_TIMESTAMP()
WHEN NOT MATCHED THEN INSERT (table_name, partition_key, committed_token, source_watermark_utc, run_id,
  try_number, updated_at)
  VALUES (@table_name, @partition_key, @fence_token, @source_watermark_utc, @run_id, @try_number,
  CURRENT_TIMESTAMP());
COMMIT TRANSACTION;
DROP TABLE IF EXISTS `{staging}`;
"""


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


def _schema() -> list[Any]:
    from google.cloud import bigquery

    return [
        bigquery.SchemaField(
            name, BIGQUERY_TYPES[name], mode="NULLABLE" if name == "customer_id" else "REQUIRED"
        )
        for name in SALES_COLUMNS
    ]


def _table_ids(client: Client, dataset: str, table: str, partition: dt.date, token: int) -> dict[str, str]:
    if not _DATASET_RE.fullmatch(dataset):
        raise InvalidNameError(f"refusing BigQuery dataset {dataset!r}: letters, digits and underscore only")
    table = validate_table_name(table)
    if "." in table:
        raise InvalidNameError(f"refusing BigQuery table {table!r}: the dataset is given separately")
    prefix = f"{client.project}.{dataset}"
    return {
        "target": f"{prefix}.{table}",
        "staging": f"{prefix}.{table}__onceflow_stage_{partition:%Y%m%d}_t{token}",
        "fence": f"{prefix}.{FENCE_TABLE}",
    }


def _drop_older_staging(client: Client, dataset: str, table: str, lease: Lease) -> None:
    """Drop this partition's staging tables of older tokens (attempts killed before their swap).

    Safe once this swap committed: BigQuery refuses every older token from now on, so no older
    attempt can still use its staging table. A failure here leaves them for the next commit.
    """
    from google.api_core.exceptions import GoogleAPICallError

    prefix = f"{table}__onceflow_stage_{lease.partition:%Y%m%d}_t"
    try:
        for item in client.list_tables(f"{client.project}.{dataset}"):
            token = item.table_id.removeprefix(prefix)
            if item.table_id.startswith(prefix) and token.isdigit() and int(token) < lease.fence_token:
                client.delete_table(f"{client.project}.{dataset}.{item.table_id}", not_found_ok=True)
    except GoogleAPICallError as exc:
        _log.warning("could not drop older staging tables of %s.%s: %s", dataset, prefix, exc)


def fenced_overwrite(
    client: Client,
    *,
    dataset: str,
    table: str,
    lease: Lease,
    rows: pd.DataFrame,
    source_watermark_utc: dt.datetime | None,
    checkpoint: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replace ``lease.partition`` of ``dataset.table`` with ``rows``, fenced by ``lease``'s token.

    :param client: a ``google.cloud.bigquery.Client`` (from ``BigQueryHook.get_client``).
    :param dataset: dataset id (letters, digits, underscore).
    :param table: table id (a plain identifier).
    :param lease: the attempt's lease; its fence token orders attempts in BigQuery's fence table.
    :param rows: sales rows of that day.
    :param source_watermark_utc: when the extract read the shop (naive UTC).
    :param checkpoint: called with ``"staged"`` after the load job (tests stall there).
    :raises StaleAttemptError: BigQuery's fence table holds a newer committed token.
    :raises OlderExtractError: the partition holds a newer extract.
    :return: job ids, destination and the rows the load job wrote.
    """
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud import bigquery

    ids = _table_ids(client, dataset, table, lease.partition, lease.fence_token)
    # The swap deletes only lease.partition but inserts every staged row (as overwrite() refuses).
    wrong = {d for d in rows["partition_date"].unique() if d != lease.partition}
    if wrong:
        raise ValueError(
            f"rows for partitions {sorted(map(str, wrong))} in a load of partition {partition_key(lease.partition)}"
        )
    data = ndjson(rows)
    load = client.load_table_from_file(
        io.BytesIO(data),
        ids["staging"],
        job_config=bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
            write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
            create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
            schema=_schema(),
        ),
        size=len(data),
    )
    load.result()
    if checkpoint is not None:
        checkpoint("staged")
    watermark = None if source_watermark_utc is None else source_watermark_utc.replace(tzinfo=dt.timezone.utc)
    columns = ", ".join(
        f"{name} {BIGQUERY_TYPES[name]}{'' if name == 'customer_id' else ' NOT NULL'}"
        for name in SALES_COLUMNS
    )
    script = SWAP_SCRIPT.format(
        columns=columns, names=", ".join(SALES_COLUMNS), stale=STALE_MARKER, older=OLDER_MARKER, **ids
    )
    params = [
        bigquery.ScalarQueryParameter("table_name", "STRING", table),
        bigquery.ScalarQueryParameter("partition_key", "STRING", partition_key(lease.partition)),
        bigquery.ScalarQueryParameter("day", "DATE", lease.partition),
        bigquery.ScalarQueryParameter("fence_token", "INT64", lease.fence_token),
        bigquery.ScalarQueryParameter("source_watermark_utc", "TIMESTAMP", watermark),
        bigquery.ScalarQueryParameter("run_id", "STRING", lease.run_id),
        bigquery.ScalarQueryParameter("try_number", "INT64", lease.try_number),
    ]
    try:
        swap = client.query(script, job_config=bigquery.QueryJobConfig(query_parameters=params))
        swap.result()
    except GoogleAPICallError as exc:
        client.delete_table(ids["staging"], not_found_ok=True)
        message = str(exc)
        where = f"BigQuery refused the swap of {ids['target']} partition {partition_key(lease.partition)}"
        if STALE_MARKER in message:
            raise StaleAttemptError(f"{where}: {lease.describe()}; {message}") from exc
        if OLDER_MARKER in message:
            raise OlderExtractError(f"{where}: {message}") from exc
        raise
    _drop_older_staging(client, dataset, table, lease)
    return {
        "load_job_id": load.job_id,
        "swap_job_id": swap.job_id,
        "destination": ids["target"],
        "partition": partition_key(lease.partition),
        "output_rows": load.output_rows,
    }
