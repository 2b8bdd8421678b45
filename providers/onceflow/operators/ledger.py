"""Thin operators over the work ledger; the hook (``LedgerHook``) is built in ``execute()``.

* :class:`RecheckOperator` starts a recheck (scope, reason, target version, priority, cap).
* :class:`RecheckDispatchOperator` claims recheck-lane items and hands each to the chain DAG
  through the outbox (run it in pool ``onceflow_recheck``); SIGTERM stops it gracefully.
* :class:`OutboxRelayOperator` delivers pending outbox rows as DAG runs and Asset events; the
  Asset events' rows are marked relayed by its success callback, once Airflow recorded them.
* :class:`LedgerReconcileOperator` runs the reconciler and reports what it found and repaired.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from airflow.sdk import AssetAlias, BaseOperator

from onceflow.hooks.ledger import OUTBOX_ASSET_ALIAS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from onceflow.shutdown import GracefulShutdown

DAY = 86400.0


def confirm_outbox_deliveries(context: Context) -> None:
    """Success callback of the relaying operators: marks relayed the outbox rows whose Asset
    events this task handed to its outlet and Airflow recorded with its success.

    Airflow runs success callbacks even when it did not take the success report (the task
    instance was marked failed or success meanwhile, by a user or the scheduler's heartbeat
    timeout), so each event is looked up in Airflow first; one not found stays pending. It runs
    after the task's other success callbacks; if the worker dies before it, the rows stay pending
    too. Either way the next pass delivers them again (same event id, ``extra["onceflow_dedup_key"]``).
    """
    from onceflow.hooks.ledger import LedgerHook, events_recorded_by_task
    from onceflow.ledger.outbox import EVENT_ID_KEY, confirm_relayed, rows_by_id

    task = context["task"]
    awaiting = list(getattr(task, "outbox_awaiting", ()))
    if awaiting:
        ledger = LedgerHook(getattr(task, "ledger_conn_id", LedgerHook.default_conn_name)).get_ledger()
        rows = rows_by_id(ledger, awaiting)
        recorded = events_recorded_by_task(context["ti"], {r.target for r in rows}, EVENT_ID_KEY)
        confirmed = confirm_relayed(ledger, [r.id for r in rows if r.dedup_key in recorded])
        task.log.info("confirmed %d of %d outbox Asset event(s) as relayed", confirmed, len(awaiting))
        missing = sorted(r.dedup_key for r in rows if r.dedup_key not in recorded)
        if missing:
            task.log.warning(
                "Airflow did not record %d Asset event(s) of this task (its success report was not "
                "taken); they stay pending for the next relay pass: %s", len(missing), missing,
            )  # fmt: skip


def _confirming(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with :func:`confirm_outbox_deliveries` after the user's success callbacks."""
    given = kwargs.get("on_success_callback")
    callbacks = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
    kwargs["on_success_callback"] = [*callbacks, confirm_outbox_deliveries]
    return kwargs


def _to_epoch(value: Any) -> float | None:
    """Accept epoch seconds, an ISO-8601 string or a datetime (params arrive as strings)."""
    import datetime as dt

    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


class RecheckOperator(BaseOperator):
    """Create a recheck: select finished items by ``scope`` and re-open them with ``reason``.

    :param scope: ``stale``, ``failed_window``, ``new_version`` or ``quality_sample``.
    :param reason: why; recorded on the recheck, its items and their transitions.
    :param kind: work item kind to recheck.
    :param target_version: processing version required for the re-run (needed for ``new_version``).
    :param priority: priority of the re-opened items.
    :param max_items: cap on the number of items.
    :param stale_after_days: age that makes a finished item stale (scope ``stale``).
    :param window_start: start of the failed window (ISO-8601), scope ``failed_window``.
    :param window_end: end of the failed window (ISO-8601).
    :param ledger_conn_id: the ledger connection.
    :return: ``{"recheck_id": ..., "selected": n, "work_keys": [...]}``.
    """

    template_fields: Sequence[str] = (
        "scope", "reason", "kind", "target_version", "priority", "max_items",
        "stale_after_days", "window_start", "window_end",
    )  # fmt: skip
    ui_color = "#fff1d6"

    def __init__(
        self,
        *,
        scope: str,
        reason: str,
        kind: str,
        target_version: str | None = None,
        priority: int | str = 0,
        max_items: int | str = 100,
        stale_after_days: float | str = 30,
        window_start: str | None = None,
        window_end: str | None = None,
        ledger_conn_id: str = "onceflow_ledger",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.scope = scope
        self.reason = reason
        self.kind = kind
        self.target_version = target_version
        self.priority = priority
        self.max_items = max_items
        self.stale_after_days = stale_after_days
        self.window_start = window_start
        self.window_end = window_end
        self.ledger_conn_id = ledger_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.ledger.recheck import RecheckRequest, start_recheck

        ledger = LedgerHook(self.ledger_conn_id).get_ledger()
        dag_run = context.get("dag_run")
        request = RecheckRequest(
            scope=self.scope,
            reason=self.reason,
            kind=self.kind,
            target_version=self.target_version or None,
            priority=int(self.priority),
            max_items=int(self.max_items),
            stale_after_seconds=float(self.stale_after_days) * DAY,
            window_start=_to_epoch(self.window_start),
            window_end=_to_epoch(self.window_end),
            requested_by=f"{self.dag_id}/{dag_run.run_id}" if dag_run else self.dag_id,
        )
        try:
            request.validate()
        except ValueError as exc:
            from onceflow.compat import AirflowFailException

            raise AirflowFailException(f"invalid recheck request: {exc}") from exc  # retrying cannot help
        result = start_recheck(ledger, request)
        self.log.info(
            "recheck %s re-opened %d item(s): %s", result.recheck_id, len(result.work_keys), self.reason
        )
        return {
            "recheck_id": result.recheck_id,
            "selected": len(result.work_keys),
            "work_keys": result.work_keys,
        }


class RecheckDispatchOperator(BaseOperator):
    """Claim recheck-lane items of ``kind`` and send each down the chain DAG via the outbox.

    Each item's dispatch is a fenced commit (step ``recheck_dispatch``) whose follow-up is a run
    of ``chain_dag_id`` with a run id unique to the item and the recheck, and whose conf carries
    the item, the recheck id, the reason and the target version. On SIGTERM (``on_kill``) it stops
    claiming and finishes the item in hand; the ledger records that.

    It runs as the processing version of the deployed code (:func:`onceflow.versions.deployed_version`,
    read on the worker), never one from the run's conf or params: items that require another
    version are left for workers running it, and the log says how many wait for which version.

    :param kind: work item kind.
    :param chain_dag_id: the DAG that processes one item (the normal chain).
    :param max_items: stop after this many items (templated).
    :param lease_seconds: lease per item.
    """

    template_fields: Sequence[str] = ("kind", "chain_dag_id", "max_items")
    ui_color = "#fff1d6"

    def __init__(
        self,
        *,
        kind: str,
        chain_dag_id: str,
        max_items: int | str = 100,
        lease_seconds: float = 120.0,
        ledger_conn_id: str = "onceflow_ledger",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.chain_dag_id = chain_dag_id
        self.max_items = max_items
        self.lease_seconds = lease_seconds
        self.ledger_conn_id = ledger_conn_id
        self._shutdown: GracefulShutdown | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.ledger import FollowUp
        from onceflow.ledger.models import stable_run_id
        from onceflow.ledger.recheck import RECHECK_LANE, waiting_for_other_versions
        from onceflow.ledger.worker import LedgerWorker, Outcome
        from onceflow.shutdown import GracefulShutdown
        from onceflow.versions import deployed_version

        ledger = LedgerHook(self.ledger_conn_id).get_ledger()
        self._shutdown = GracefulShutdown()
        version = deployed_version()

        def dispatch(lease: Any) -> Outcome:
            conf = {
                "work_key": lease.work_key,
                "recheck_id": lease.recheck_id,
                "reason": lease.reason,
                "target_version": version,
                "onceflow_lane": RECHECK_LANE,
            }
            run_id = stable_run_id(lease.work_key, f"recheck{lease.recheck_id}", version)
            return Outcome({"dispatched_to": self.chain_dag_id, "run_id": run_id},
                           [FollowUp.dag_run(self.chain_dag_id, conf, run_id=run_id)])  # fmt: skip

        ti = context["ti"]
        worker = LedgerWorker(
            ledger,
            kind=self.kind,
            step="recheck_dispatch",
            owner=f"{socket.gethostname()}:{ti.dag_id}.{ti.task_id}.{ti.run_id}.{ti.try_number}",
            worker_version=version,
            handler=dispatch,
            lease_seconds=self.lease_seconds,
            lane=RECHECK_LANE,
            shutdown=self._shutdown,
        )
        report = worker.run(max_items=int(self.max_items))
        self.log.info(
            "dispatched %d recheck item(s) to %s as processing version %s",
            len(report.completed), self.chain_dag_id, version,
        )  # fmt: skip
        for required, count in sorted(waiting_for_other_versions(ledger, self.kind, version).items()):
            self.log.warning(
                "%d recheck item(s) of kind %r require processing version %s; this worker runs %s: "
                "left for a worker running %s", count, self.kind, required, version, required,
            )  # fmt: skip
        return {**report.as_dict(), "worker_version": version}

    def on_kill(self) -> None:
        if self._shutdown is not None:
            self._shutdown.request()


class OutboxRelayOperator(BaseOperator):
    """Deliver pending outbox rows: DAG runs (idempotent by run id) and Asset events.

    Asset events are added to this task's ``AssetAlias("onceflow-ledger-outbox")`` outlet, so
    Airflow records them when the task succeeds.

    :param sink: ``task_sdk`` (default; works in Airflow 3 workers) or ``metadata_db`` (ORM;
        only where the metadata DB may be used directly).
    :param max_rows: rows per run.
    """

    template_fields: Sequence[str] = ("max_rows",)
    ui_color = "#e3f6e3"

    def __init__(
        self,
        *,
        sink: str = "task_sdk",
        max_rows: int | str = 500,
        relay_name: str = "airflow",
        ledger_conn_id: str = "onceflow_ledger",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [AssetAlias(OUTBOX_ASSET_ALIAS)])
        super().__init__(**_confirming(kwargs))
        if sink not in ("task_sdk", "metadata_db"):
            raise ValueError(f"sink must be 'task_sdk' or 'metadata_db', not {sink!r}")
        self.sink = sink
        self.max_rows = max_rows
        self.relay_name = relay_name
        self.ledger_conn_id = ledger_conn_id
        self.outbox_awaiting: list[int] = []

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.ledger.outbox import OutboxRelay

        ledger = LedgerHook(self.ledger_conn_id).get_ledger()
        report = OutboxRelay(ledger, make_sink(self.sink, context), name=self.relay_name,
                             max_rows=int(self.max_rows)).relay_once()  # fmt: skip
        self.outbox_awaiting = report.awaiting  # confirmed once Airflow recorded this task's success
        self.log.info(
            "relayed %d outbox row(s), %d already existed, %d Asset event(s) recorded when this task succeeds",
            report.relayed, report.already_existed, len(report.awaiting),
        )  # fmt: skip
        if report.errors:
            self.log.warning("undelivered rows stay pending: %s", report.errors)
        return {
            "relayed": report.relayed,
            "already_existed": report.already_existed,
            "errors": report.errors,
            "awaiting": report.awaiting,
        }


def run_exists_in(context: Context) -> Any:
    """``(dag_id, run_id) -> bool`` answered by Airflow through the running task's Task SDK."""
    ti = context["ti"]

    def run_exists(dag_id: str, run_id: str) -> bool:
        return bool(ti.get_dr_count(dag_id=dag_id, run_ids=[run_id]))

    return run_exists


def make_sink(kind: str, context: Context) -> Any:
    """The sink the outbox relay delivers through: the Task SDK (in a task) or the metadata database."""
    from onceflow.hooks.ledger import MetadataDbSink, TaskSdkSink

    if kind == "metadata_db":
        return MetadataDbSink()
    return TaskSdkSink(context.get("outlet_events"))


class LedgerReconcileOperator(BaseOperator):
    """Run the ledger reconciler once: expire dead leases, re-create missing follow-ups, and
    catch (and with ``relay_stalled_rows``, deliver) a stalled outbox relay.

    :param grace_seconds: how long past expiry a lease is left for its holder to heartbeat.
    :param relay_stall_seconds: an outbox row pending longer than this means the relay stalled.
    :param relay_stalled_rows: deliver stalled rows itself (Task SDK sink) instead of only reporting.
    :param fail_on_unrepaired: fail the task when a finding could not be repaired (alerts).
    :param check_airflow_runs: ask Airflow whether each relayed run exists; re-queue missing ones.
    """

    template_fields: Sequence[str] = ("grace_seconds", "relay_stall_seconds")
    ui_color = "#e8e0ff"

    def __init__(
        self,
        *,
        grace_seconds: float | str = 30.0,
        relay_stall_seconds: float | str = 900.0,
        relay_stalled_rows: bool = True,
        fail_on_unrepaired: bool = True,
        check_airflow_runs: bool = True,
        ledger_conn_id: str = "onceflow_ledger",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [AssetAlias(OUTBOX_ASSET_ALIAS)])
        super().__init__(**_confirming(kwargs))
        self.outbox_awaiting: list[int] = []
        self.check_airflow_runs = check_airflow_runs
        self.grace_seconds = grace_seconds
        self.relay_stall_seconds = relay_stall_seconds
        self.relay_stalled_rows = relay_stalled_rows
        self.fail_on_unrepaired = fail_on_unrepaired
        self.ledger_conn_id = ledger_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.ledger.reconcile import reconcile

        ledger = LedgerHook(self.ledger_conn_id).get_ledger()
        report = reconcile(
            ledger,
            grace_seconds=float(self.grace_seconds),
            relay_stall_seconds=float(self.relay_stall_seconds),
            sink=make_sink("task_sdk", context) if self.relay_stalled_rows else None,
            run_exists=run_exists_in(context) if self.check_airflow_runs else None,
        )
        self.outbox_awaiting = report.awaiting  # confirmed once Airflow recorded this task's success
        for finding in report.findings:
            self.log.warning("%s %s: %s (repaired=%s)", finding.check, finding.work_key, finding.detail,
                             finding.repaired)  # fmt: skip
        unrepaired = [f for f in report.findings if not f.repaired]
        if unrepaired and self.fail_on_unrepaired:
            raise RuntimeError(f"{len(unrepaired)} ledger finding(s) could not be repaired: {unrepaired[:5]}")
        return report.as_dict()
