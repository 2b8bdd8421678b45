"""The reconcile check of daily_sales partition loads: their two-database commit.

A load commits in the warehouse first (the authority: the fenced overwrite and its
``load_audit`` row) and then in the ledger (``commit_result``). A crash between the two leaves a
partition whose audit row names a ledger token the ledger has no result for.
:func:`partition_load_check` finds those rows and records the result with actor ``reconciler``
(event ``record_result``); a second pass finds nothing to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.ledger.reconcile import Finding
from onceflow.sales.ledger_link import STEP, result_payload

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.reconcile import ExtraCheck
    from onceflow.sales.partition_store import PartitionStore


def record_missing_results(ledger: Ledger, store: PartitionStore) -> list[Finding]:
    """Record every ledger-fenced warehouse commit whose ledger result is missing or older."""
    found = []
    for work_key, audit in store.ledger_commits():
        results = [
            r
            for r in ledger.results(work_key)
            if r.step == STEP and r.processing_version == audit.processing_version
        ]
        assert audit.ledger_token is not None  # ledger_commits() returns ledger-fenced loads only
        if results and max(r.fencing_token for r in results) >= audit.ledger_token:
            continue
        reason = (
            f"warehouse committed {audit.table_name} {audit.partition_key} under ledger token {audit.ledger_token} "
            f"(run {audit.run_id} try {audit.try_number}) but the ledger had no result; recorded from load_audit"
        )
        written = ledger.record_result(
            work_key, STEP, audit.processing_version, audit.ledger_token, result_payload(audit), reason=reason
        )
        if written:
            found.append(Finding("partition_result_missing", work_key, reason, repaired=True))
    return found


def partition_load_check(store: PartitionStore) -> ExtraCheck:
    """An ``extra_checks`` entry for :func:`onceflow.ledger.reconcile.reconcile`."""

    def check(ledger: Ledger) -> list[Finding]:
        return record_missing_results(ledger, store)

    return check
