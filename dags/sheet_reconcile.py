"""sheet_reconcile: repair claims without runs and flag inconsistent rows, logging every action."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, get_current_context, task

DOC_MD = """
### sheet_reconcile

Scans the queue sheet against Airflow and repairs what the normal path cannot see:

* rows **PROCESSING past their lease** (`lease_minutes`, counted from the claim time carried in
  the claim token) with no queued or running `article_pipeline` run: a missing run (the claimer
  died between claim and run creation) is created, a failed one is cleared, both under the same
  deterministic run id, so repair never duplicates work; after `max_redrives` failures the row
  is marked FAILED. A row of the batch lane (its ledger item names an `article_batch` run) is
  left to its batch run while that is queued or running; once it has ended without the row's
  outcome, the row is re-driven alone in `article_pipeline`. The run id uses the processing version the row was **claimed under** (carried
  in its claim token); the `processing_version` param only serves claims whose token carries no
  version (made before tokens did);
* a URL claimed by two rows: the row the article's run does not work on (its conf carries the
  other row's claim token) becomes DUPLICATE; without a run, the later claim;
* a claimed row with an invalid URL (its claimer stopped before marking it) becomes INVALID with
  the reason;
* rows DONE without a published link, and published links on rows that are not DONE: flagged;
* the sheet against the work ledger (`onceflow_ledger`): a claimed row without an `article` item
  gets one; an item the ledger gave up on or sent back for correction turns its PROCESSING row
  FAILED or INVALID with the ledger's reason once no run is active; a FAILED row abandons its
  pending item; a DONE row with a link records the result the ledger missed; a successful run
  whose item has no result is flagged. Ledger repairs are ledger transitions by the reconciler;
* derived cells that disagree with their row (an INVALID/DUPLICATE row without a reason, a
  `run_id` naming another article's run) are recomputed and rewritten.

Every action is appended to the `audit` tab with its reason and time; flags are not repeated.
Docs: `docs/sheet-queue.md`.
"""


@dag(
    dag_id="sheet_reconcile",
    schedule="*/15 * * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["onceflow", "sheet-queue", "reconcile"],
    doc_md=DOC_MD,
    params={"lease_minutes": 60, "processing_version": "v1", "max_redrives": 3},
    default_args={"owner": "onceflow", "retries": 2, "retry_delay": timedelta(minutes=1)},
)
def sheet_reconcile() -> None:
    @task(pool="onceflow_sheets")
    def reconcile() -> list[dict[str, Any]]:
        """One read of the sheet, run states from Airflow, then the repairs, each audited."""
        from datetime import datetime, timezone

        from onceflow.hooks.ledger import LedgerHook
        from onceflow.hooks.sheets import SheetQueueHook
        from onceflow.operators.sheets import ARTICLE_BATCH, ARTICLE_PIPELINE, create_dag_run, run_claim_token
        from onceflow.sheets import ledger_link, relay
        from onceflow.sheets import reconcile as rec

        context = get_current_context()
        params = context["params"]
        ti = context["ti"]
        version = str(params["processing_version"])
        queue = SheetQueueHook().queue(version)
        ledger = LedgerHook().get_ledger()

        def state_of(dag_id: str, run_id: str) -> str | None:
            if not ti.get_dr_count(dag_id=dag_id, run_ids=[run_id]):
                return None
            state = ti.get_dagrun_state(dag_id=dag_id, run_id=run_id)
            # the Task SDK answers with its DagRunState enum, whose str() is "DagRunState.FAILED":
            # the plan compares the value ("failed", "success", ...)
            return str(getattr(state, "value", state))

        # the lease is about the real present, not the data interval
        now = datetime.now(timezone.utc)
        plan = rec.plan(
            queue.snapshot(),
            now=now,
            lease=timedelta(minutes=float(params["lease_minutes"])),
            version=version,
            run_state=lambda run_id: state_of(ARTICLE_PIPELINE, run_id),
            batch_state=lambda run_id: state_of(ARTICLE_BATCH, run_id),
            audit=queue.read_audit(),
            max_redrives=int(params["max_redrives"]),
            ledger=lambda row_key: ledger_link.ledger_view(ledger, row_key),
            # the claim in the article's run conf; in the batch lane, the claim its item names
            run_claim=lambda run_id: (
                run_claim_token(ARTICLE_PIPELINE, run_id) or ledger_link.batch_claim(ledger, run_id)
            ),
        )
        entries = rec.apply(
            plan.actions,
            queue,
            now=now,
            create_run=lambda run_id, conf, reset: create_dag_run(
                ARTICLE_PIPELINE, run_id, conf, reset=reset
            ),
            ledger_repair=lambda action, conf: ledger_link.repair(
                ledger,
                action.kind,
                conf=conf,
                row_number=action.row.number,
                reason=action.reason,
                published_url=action.row.get("published_url").strip(),
            ),
            # its INVALID, DUPLICATE and FAILED leave as every final status does: through the
            # ledger's outbox, then one relay pass
            send_rows=lambda writes: relay.send_rows(queue, ledger, rec.RECONCILE_STEP, writes),
        )
        # row anchors of rows finished without onceflow's final transition (by hand, or by an
        # older onceflow that kept them), and of rows whose run has succeeded (nothing writes
        # through their anchor any more): Google caps developer metadata, so they must not pile up
        queue.sweep_anchors(released=plan.released)
        return entries

    reconcile()


sheet_reconcile()
