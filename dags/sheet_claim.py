"""sheet_claim: wait for NEW rows in the queue sheet, claim them, start one article run per row."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from onceflow.operators.sheets import SheetClaimOperator
from onceflow.sensors.sheets import NewRowsSensor

DOC_MD = """
### sheet_claim

Every five minutes: a deferrable `NewRowsSensor` waits in the triggerer (holding no worker or pool
slot) until the queue tab has NEW rows or write-backs of it wait in the ledger's outbox (asked
first, one database query), then `SheetClaimOperator` relays those write-backs and claims up to
`max_rows` NEW rows
**in the sheet first** (one read, a `spreadsheets.get` bringing the tab id with the values, and
one conditional `batchUpdate`; a verification read when rows moved) and only then creates one `article_pipeline`
run per claimed row, with the deterministic run id `sheet__<row key>__<processing version>`. The
claim token carries the processing version, so `sheet_reconcile` repairs the claim under it. A
run that already exists counts as success when its conf carries this claim's token; when it
carries another claim's (two claimers each won a row of the same URL), this row is marked
DUPLICATE of the row the run works on.

**Lanes.** `batch_size` 0 (the default) makes one `article_pipeline` run per row. With 2 or
more, the claimed rows whose article is new to the ledger go in batches of that many to
`article_batch` (one run per batch, each task carrying one step for every article of it, each
article still its own fenced ledger step): fewer task processes and Sheets requests per article,
and a failure of one article never fails the others. Docs: `docs/articles.md` ("The batch lane").

Connection `onceflow_sheets` (extras `spreadsheet_id`, `sheet`, and `api_endpoint` for the
emulator). Pool `onceflow_sheets`. Orphaned claims are repaired by `sheet_reconcile`.
Docs: `docs/sheet-queue.md`.
"""


@dag(
    dag_id="sheet_claim",
    schedule="*/5 * * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["onceflow", "sheet-queue"],
    doc_md=DOC_MD,
    params={"max_rows": 50, "processing_version": "v1", "batch_size": 0},
    default_args={"owner": "onceflow", "retries": 2, "retry_delay": timedelta(seconds=30)},
)
def sheet_claim() -> None:
    wait = NewRowsSensor(
        task_id="wait_for_new_rows",
        pool="onceflow_sheets",
        ledger_conn_id="onceflow_ledger",  # write-backs waiting in the outbox wake it too
        poke_interval=30,
        timeout=4 * 60,
        soft_fail=True,  # nothing new before the next run: skip, do not fail
    )
    claim = SheetClaimOperator(
        task_id="claim_rows",
        max_rows="{{ params.max_rows }}",  # type: ignore[arg-type]  # rendered to a number
        processing_version="{{ params.processing_version }}",
        batch_size="{{ params.batch_size }}",
    )
    wait >> claim


sheet_claim()
