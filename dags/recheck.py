"""recheck: re-open finished work for a stated reason, as first-class work in its own pool."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag

from onceflow.operators.ledger import OutboxRelayOperator, RecheckDispatchOperator, RecheckOperator

DOC_MD = """
### recheck

Rechecks are planned work, not "run everything again". Trigger this DAG from the UI: the
trigger dialog renders the params as a form.

* **scope**: `stale` (finished longer ago than *stale_after_days*), `failed_window` (gave up
  between *window_start* and *window_end*, e.g. a provider outage), `new_version` (no result at
  *target_version* yet; only workers running that version take them), `quality_sample` (a
  reproducible random sample);
* **reason**: required; stored on the recheck, every re-opened item and every transition, so
  cost and effect can be queried later (`onceflow.ledger.recheck.recheck_report`);
* **priority**, **max_items**: how urgent, and a hard cap.

`start` re-opens the items in the ledger's `recheck` lane; `dispatch` claims them (pool
`onceflow_recheck`, so rechecks never take the slots of new work) and hands each to the chain
DAG's recheck lane (*chain_dag_id*, default `article_pipeline_recheck`: pool `onceflow_recheck`,
a priority weight below new work, its own `max_active_runs`) through the outbox; `relay` creates
those runs with run ids unique per item and recheck, conf `onceflow_lane="recheck"`. Pause
`article_pipeline_recheck` to hold the chain runs back. Docs: `docs/ledger.md`.
"""

SCOPES = ["stale", "failed_window", "new_version", "quality_sample"]


@dag(
    dag_id="recheck",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["onceflow", "ledger", "recheck"],
    doc_md=DOC_MD,
    default_args={"owner": "onceflow", "retries": 2, "retry_delay": timedelta(minutes=1)},
    params={
        "scope": Param(
            "stale", type="string", enum=SCOPES, title="Scope", description="Which items to recheck"
        ),
        "reason": Param(
            "",
            type="string",
            minLength=3,
            title="Reason",
            description="Why; recorded on every re-opened item",
        ),
        "kind": Param("article", type="string", title="Work item kind"),
        "target_version": Param(
            "",
            type=["null", "string"],
            title="Target processing version",
            description="Required for scope new_version; leave empty to keep each item's version",
        ),
        "priority": Param(0, type="integer", minimum=-100, maximum=100, title="Priority"),
        "max_items": Param(100, type="integer", minimum=1, maximum=100_000, title="Max items"),
        "stale_after_days": Param(30, type="number", minimum=0, title="Stale after (days)"),
        "window_start": Param(
            None,
            type=["null", "string"],
            format="date-time",
            title="Failed window start (scope failed_window)",
        ),
        "window_end": Param(
            None, type=["null", "string"], format="date-time", title="Failed window end (scope failed_window)"
        ),
        "chain_dag_id": Param(
            "article_pipeline_recheck",
            type="string",
            title="Chain DAG that processes one item",
            description="The chain's recheck lane (a run sent to a new-work DAG is refused there)",
        ),
    },
)
def recheck() -> None:
    start = RecheckOperator(
        task_id="start",
        scope="{{ params.scope }}",
        reason="{{ params.reason }}",
        kind="{{ params.kind }}",
        target_version="{{ params.target_version or '' }}",
        priority="{{ params.priority }}",
        max_items="{{ params.max_items }}",
        stale_after_days="{{ params.stale_after_days }}",
        window_start="{{ params.window_start or '' }}",
        window_end="{{ params.window_end or '' }}",
    )
    dispatch = RecheckDispatchOperator(
        task_id="dispatch",
        pool="onceflow_recheck",
        kind="{{ params.kind }}",
        chain_dag_id="{{ params.chain_dag_id }}",
        max_items="{{ params.max_items }}",
    )
    relay = OutboxRelayOperator(task_id="relay", pool="onceflow_recheck")
    start >> dispatch >> relay


recheck()
