"""ledger_reconcile: scan the work ledger for broken invariants and repair them, on record."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from onceflow.operators.ledger import LedgerReconcileOperator, OutboxRelayOperator

DOC_MD = """
### ledger_reconcile

The work ledger's reconciler, every 10 minutes (a sibling of `sheet_reconcile`, which repairs the
sheet; the two may be folded into one general reconciler later):

* **expired leases still active** go back to `pending` (transition `expire`);
* **results without their follow-up** (a promised outbox row or next work item is missing) are
  re-created (transition `repair_follow_up`);
* **a stalled relay** (an outbox row pending for longer than `relay_stall_seconds`) is reported
  and its rows are delivered;
* **partition loads the ledger missed** (`partition_results`): a `load_audit` row written under a
  ledger token whose ledger result is missing or older (the load died between the warehouse
  commit and the ledger commit) is recorded as the item's result (transition `record_result`).

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

    @task(task_id="partition_results")
    def partition_results() -> list[dict[str, object]]:
        """Record warehouse loads whose ledger commit is missing (crash between the two commits)."""
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.hooks.warehouse import WarehouseHook
        from onceflow.sales.config import SalesConfig
        from onceflow.sales.ledger_checks import record_missing_results

        warehouse = WarehouseHook()
        if warehouse.is_bigquery:
            return []  # the audit rows live in the audit connection's database; not wired here
        store = warehouse.get_store(SalesConfig.from_env().table)
        findings = record_missing_results(LedgerHook().get_ledger(), store)
        return [f.__dict__ for f in findings]

    reconcile >> partition_results()


ledger_reconcile()
