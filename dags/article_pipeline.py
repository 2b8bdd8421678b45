"""article_pipeline: one run per claimed sheet row (created by ``sheet_claim`` or ``sheet_reconcile``)."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from onceflow.operators.sheets import ClaimedRowOperator

DOC_MD = """
### article_pipeline

One run per claimed row of the article queue sheet. Runs are created only by `sheet_claim`
(after the row is claimed in the sheet) and by `sheet_reconcile` (repairing a claim that has no
run), always with the deterministic run id `sheet__<row key>__<processing version>`, so Airflow
refuses a second run for the same article.

The run's conf carries the row's claim token; every task finds the row **by that token**, never
by its position (the editor may sort, insert and delete rows at any time): reads and writes go
through the row anchor (developer metadata `onceflow.claim = <token>`) the claim put on the row.

**Status: first step only.** `read_claimed_row` (`ClaimedRowOperator`) is a fenced step on the
article's ledger item `article:<row key>`: it leases the item, reads the claimed row back from the
sheet by token, checks that its URL is the one the run was created for, records the run id beside
it and commits the result under the lease (a retry after the commit repeats nothing). A row that
is gone or points elsewhere moves the item to `needs_correction` and fails the task without retry;
`sheet_reconcile` then marks the row INVALID with the reason. Recheck runs (conf `work_key`) find
the claim on the ledger item.
The article chain itself (fetch, extract, translate, score, polish or publish, and writing the
published link back) comes in a later issue; until then rows stay PROCESSING after this run and
`sheet_reconcile` flags them as "run succeeded but the row is still PROCESSING".

Docs: `docs/sheet-queue.md`.
"""


@dag(
    dag_id="article_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["onceflow", "sheet-queue"],
    doc_md=DOC_MD,
    default_args={"owner": "onceflow", "retries": 2, "retry_delay": timedelta(minutes=1)},
    max_active_runs=16,
)
def article_pipeline() -> None:
    ClaimedRowOperator(task_id="read_claimed_row")


article_pipeline()
