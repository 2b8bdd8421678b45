"""ledger_reconcile: scan the work ledger for broken invariants and repair them, on record."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from onceflow.operators.ledger import LedgerReconcileOperator, OutboxRelayOperator

DOC_MD = """
### ledger_reconcile

The work ledger's reconciler, every 10 minutes (a sibling of `sheet_reconcile`, which repairs the
sheet; the two may be folded into one general reconciler later):

* **expired leases still active** go back to `pending` (transition `expire`);
* **results without their follow-up** (a promised outbox row or next work item is missing) are
  re-created (transition `repair_follow_up`);
* **a stalled relay** (an outbox row pending for longer than `relay_stall_seconds`) is reported
  and its rows are delivered.

Every repair is a transition with actor `reconciler`, never an invisible edit; running it twice
repairs nothing twice. The task fails (and alerts) when a finding could not be repaired. The
`relay` task delivers outbox rows on the same cadence. Docs: `docs/ledger.md`.
"""


@dag(
    dag_id="ledger_reconcile",
    schedule="*/10 * * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["onceflow", "ledger", "reconcile"],
    doc_md=DOC_MD,
    default_args={"owner": "onceflow", "retries": 2, "retry_delay": timedelta(minutes=1)},
)
def ledger_reconcile() -> None:
    relay = OutboxRelayOperator(task_id="relay")
    reconcile = LedgerReconcileOperator(task_id="reconcile", grace_seconds=30, relay_stall_seconds=900)
    relay >> reconcile


ledger_reconcile()
