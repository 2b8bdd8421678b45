"""article_pipeline: one run per claimed sheet row (created by ``sheet_claim`` or ``sheet_reconcile``),
and article_pipeline_recheck: the same chain in the recheck lane (runs created by ``recheck``)."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from onceflow.lanes import LANES, NEW_LANE, RECHECK_LANE
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

**Two lanes, two DAGs from this file.** `article_pipeline` takes new work (pool `onceflow_sheets`,
16 active runs). `article_pipeline_recheck` takes the runs the `recheck` DAG dispatches (conf
`onceflow_lane="recheck"`): the same tasks, every one in pool `onceflow_recheck` at priority
weight -100, with its own 4 active runs, so a recheck of thousands of articles never delays a new
one. Pause `article_pipeline_recheck` to hold rechecks back without touching new work. A run sent
to the other lane's DAG fails at once, naming the right one.

**Stopping a run.** Marking a running task failed, or any SIGTERM Airflow sends it, hands the
article's ledger lease back at once (`release`), so a new attempt need not wait for it to expire.
The article chain itself (fetch, extract, translate, score, polish or publish, and writing the
published link back) comes in a later issue; until then rows stay PROCESSING after this run and
`sheet_reconcile` flags them as "run succeeded but the row is still PROCESSING".

Docs: `docs/sheet-queue.md`.
"""

#: The new-work lane's DAG id; the recheck lane's is this plus ``_recheck``.
CHAIN_DAG_ID = "article_pipeline"


def article_pipeline(lane_name: str) -> None:
    """The chain DAG of one lane (``onceflow.lanes``): new work, or rechecks apart from it."""
    lane = LANES[lane_name]

    @dag(
        dag_id=lane.dag_id(CHAIN_DAG_ID),
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        tags=["onceflow", "sheet-queue", f"lane:{lane.name}"],
        doc_md=DOC_MD,
        default_args={"owner": "onceflow", "retries": 2, "retry_delay": timedelta(minutes=1)},
        max_active_runs=lane.max_active_runs,
    )
    def chain() -> None:
        ClaimedRowOperator(task_id="read_claimed_row", lane=lane.name, **lane.task_args())

    chain()


article_pipeline(NEW_LANE)
article_pipeline(RECHECK_LANE)
