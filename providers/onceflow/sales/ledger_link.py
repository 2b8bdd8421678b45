"""daily_sales partitions as work-ledger items: the commit protocol across the ledger and the warehouse.

(Sales knowledge on top of the generic ledger, as :mod:`onceflow.sheets.ledger_link` is for the
sheet queue; the reconcile check is :mod:`onceflow.sales.ledger_checks`.)

One partition of one table is one work item (kind ``partition_load``, key
``daily_sales/2024-10-27``). An attempt (an Airflow task try, owner ``dag/run/try``):

1. **lease** the item in the ledger (created, or re-opened when an earlier run finished it);
   the ledger's fencing token is the attempt's proof of ownership; heartbeats while loading;
2. **register** the token in the warehouse (``load_fence``, :mod:`onceflow.sales.fencing`): the
   attempt takes the partition's next fence token; older attempts of either fencing mode are
   refused from now on;
3. **fenced overwrite** in the warehouse, the authority: one transaction checks that this
   attempt still holds the newest token and that its extract is not older than the committed one,
   replaces the partition and writes ``load_audit``;
4. **commit_result** in the ledger (fenced, idempotent): the item is ``done`` with
   ``{row_count, checksum, partition, ...}``.

A warehouse refusal is recorded in the ledger (``commit_refused``). An extract older than the
committed one is no failure of the item: the partition already holds newer data, so the item is
committed with what the warehouse's audit row says (reason ``kept the newer load``). A crash
between 3 and 4 is repaired by the task's retry (it reloads the same rows under a newer token) or,
when no retry comes, by :func:`onceflow.sales.ledger_checks.record_missing_results` in
``ledger_reconcile``.

**Stopped attempts.** With a ``shutdown`` flag (the operator's ``on_kill``, which Airflow calls on
SIGTERM), a stop hands the ledger lease back at once (``release``, the item pending, available
now); the attempt then commits nothing in the ledger. The warehouse needs nothing: its open
transaction dies with the process, and if it had already committed, the next attempt's higher
token reloads the day (or the reconciler records the audit row as the result).
Nothing here imports Airflow.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from onceflow.ledger.errors import StaleFenceError
from onceflow.ledger.keyed import Heartbeat
from onceflow.ledger.steps import hand_back_on_shutdown
from onceflow.ledger.worker import ShutdownRequested

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.sales.partition_store import AuditRecord, PartitionStore
    from onceflow.sales.partition_store import Lease as PartitionLease
    from onceflow.shutdown import GracefulShutdown

KIND = "partition_load"
STEP = "load"


def work_key_for(table: str, partition: dt.date | str) -> str:
    """The stable key of one partition's load: ``daily_sales/2024-10-27``."""
    day = partition if isinstance(partition, str) else partition.isoformat()
    return f"{table}/{day}"


def result_payload(audit: AuditRecord) -> dict[str, Any]:
    """The ledger result of a load: what the warehouse's audit row says."""
    return {
        "table": audit.table_name,
        "partition": audit.partition_key,
        "row_count": audit.row_count,
        "reject_count": audit.reject_count,
        "checksum": audit.checksum,
        "run_id": audit.run_id,
        "try_number": audit.try_number,
    }


def load_partition(
    ledger: Ledger,
    store: PartitionStore,
    *,
    partition: dt.date,
    owner: str,
    run_id: str,
    try_number: int,
    processing_version: str,
    write: Callable[[PartitionLease], AuditRecord],
    lease_seconds: float = 300.0,
    permanent: Callable[[BaseException], bool] = lambda _exc: False,
    checkpoint: Callable[[str], None] | None = None,
    shutdown: GracefulShutdown | None = None,
) -> AuditRecord:
    """Run one attempt of a partition load through the ledger (see the module docstring).

    :param write: does the fenced warehouse write with the partition lease (e.g.
        ``store.overwrite``); it must check the fence in the write's transaction.
    :param permanent: errors for which retrying cannot help (``needs_correction``, not ``retry``).
    :param checkpoint: called with ``"leased"``, ``"registered"`` and ``"warehouse_committed"``
        (crash tests pause there).
    :param shutdown: requested when the attempt is being stopped: the ledger lease goes back at once.
    :raises LeaseHeld: another attempt's ledger lease is current.
    :raises StaleAttemptError: the warehouse refused this attempt (recorded in the ledger).
    :raises ShutdownRequested: the attempt was stopped; its lease was handed back.
    """
    from onceflow.sales.deadlines import DeadlineExceeded
    from onceflow.sales.partition_store import OlderExtractError, StaleAttemptError

    notify = checkpoint or (lambda _stage: None)
    key = work_key_for(store.table_name, partition)
    lease = ledger.lease_key(
        KIND,
        key,
        owner,
        lease_seconds,
        processing_version,
        reopen_reason=f"reload by {owner}",
        payload={"table": store.table_name, "partition": partition.isoformat()},
    )
    notify("leased")
    with hand_back_on_shutdown(ledger, lease, shutdown) as handback:
        try:
            with Heartbeat(lease):
                wlease = store.register_ledger_token(
                    partition, token=lease.token, work_key=key, run_id=run_id, try_number=try_number
                )
                notify("registered")
                audit = write(wlease)
        except Exception as exc:
            if handback.requested:
                raise ShutdownRequested(f"load of {key} stopped; its ledger lease was handed back") from exc
            if isinstance(exc, OlderExtractError):
                _keep_the_newer_load(ledger, lease, store, partition, exc)
                raise
            if isinstance(exc, StaleAttemptError):
                ledger.record_refusal(lease, f"warehouse refused the overwrite: {exc}")
                raise
            try:
                if permanent(exc):
                    ledger.mark_invalid(lease, str(exc) or type(exc).__name__)
                else:
                    ledger.fail(lease, exc, backoff_seconds=0)  # the caller's retry owns the timing
            except StaleFenceError:
                pass  # a newer attempt owns the item; this refusal is recorded
            if isinstance(exc, DeadlineExceeded):
                raise exc.noting(
                    f"The partition's work-ledger lease ({key}) was handed back: the next try need not "
                    "wait for it to expire."
                ) from exc
            raise
        notify("warehouse_committed")
        if handback.requested:
            raise ShutdownRequested(
                f"load of {key} stopped after the warehouse commit; its ledger lease was handed back "
                "(the next attempt reloads the day, or ledger_reconcile records the audit row)"
            )
        ledger.commit_result(lease, STEP, result_payload(audit))
    return audit


def _keep_the_newer_load(
    ledger: Ledger, lease: Any, store: PartitionStore, partition: dt.date, exc: BaseException
) -> None:
    """This attempt's extract was older: the item's result is the load the warehouse holds."""
    committed = store.audit(partition)
    try:
        if committed is None:
            ledger.release(lease, reason=str(exc))
        else:
            ledger.commit_result(
                lease, STEP, result_payload(committed), reason=f"kept the newer load: {exc}"[:2000]
            )
    except StaleFenceError:
        pass  # a newer attempt owns the item
