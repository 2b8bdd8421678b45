"""article_pipeline: one run per claimed sheet row (created by ``sheet_claim`` or ``sheet_reconcile``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, get_current_context, task

DOC_MD = """
### article_pipeline

One run per claimed row of the article queue sheet. Runs are created only by `sheet_claim`
(after the row is claimed in the sheet) and by `sheet_reconcile` (repairing a claim that has no
run), always with the deterministic run id `sheet__<row key>__<processing version>`, so Airflow
refuses a second run for the same article.

The run's conf carries the row's claim token; every task finds the row **by that token**, never
by its position (the editor may sort, insert and delete rows at any time): reads and writes go
through the row anchor (developer metadata `onceflow.claim = <token>`) the claim put on the row.

**Status: first step only.** `read_claimed_row` reads the claimed row back from the sheet by
token, checks that its URL is the one the run was created for, and records the run id beside it.
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
    @task(pool="onceflow_sheets")
    def read_claimed_row() -> dict[str, Any]:
        """Find the row by claim token, check it is the article this run is for, record the run."""
        from onceflow.hooks.sheets import SheetQueueHook
        from onceflow.sheets.validation import judge_url

        context = get_current_context()
        dag_run = context["dag_run"]
        conf = dag_run.conf or {}
        token = conf.get("claim_token")
        if not token:
            raise ValueError("run conf has no claim_token: article_pipeline runs are created by sheet_claim")
        hook = SheetQueueHook(spreadsheet_id=conf.get("spreadsheet_id"), sheet=conf.get("sheet"))
        queue = hook.queue(str(conf.get("processing_version", "v1")))
        row = queue.locate(token)  # through the row anchor: one small read, any sheet size
        if row is None:
            raise LookupError(f"no row of the queue carries claim token {token!r}: the claim was removed")
        verdict = judge_url(row)
        if verdict.key != conf.get("row_key"):
            raise ValueError(
                f"row {row.number} carries token {token!r} but its URL {row.url!r} is not the article "
                f"this run was created for ({conf.get('url')!r})"
            )
        fields = {"run_id": dag_run.run_id, "claim_token": token}
        if row.token:
            from onceflow.sheets.model import token_time

            claimed_at = token_time(row.token)
            if claimed_at is not None:
                fields["claimed_at"] = claimed_at.isoformat(timespec="seconds")
        row = queue.write_fields(token, fields)
        return {
            "row_number_at_read": row.number,
            "url": verdict.normalised_url,
            "row_key": verdict.key,
            "status": row.status_cell.raw,
            "claim_token": token,
        }

    read_claimed_row()


article_pipeline()
