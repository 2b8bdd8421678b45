"""``PartitionOverwriteOperator``: replace exactly one day partition of the sales table, fenced.

The operator is thin: it reads the staged clean output of its run, asks
:class:`~onceflow.hooks.warehouse.WarehouseHook` for the partition store, takes the partition's
lease (fence token) and overwrites the partition in one transaction together with its rejects and
its ``load_audit`` row. See :mod:`onceflow.sales.partition_store` for the protocol.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from onceflow.sales.partition_store import AuditRecord
    from onceflow.shutdown import GracefulShutdown


class PartitionOverwriteOperator(BaseOperator):
    """Overwrite one partition of a warehouse sales table from a staged clean result.

    :param partition: the business-local day ``YYYY-MM-DD`` (templated).
    :param staging_dir: folder written by :func:`onceflow.sales.staging.write_clean` (templated): a
        ``file://`` or ``gs://`` URI, or an absolute local path, resolved through
        :meth:`~onceflow.hooks.storage.StorageHook.path` of ``storage_conn_id``. ``None``: the
        run's own folder, :func:`onceflow.sales.staging.run_dir` under ``storage_conn_id``'s sales
        staging base (what daily_sales' tasks write; no XCom pull needed to find it).
    :param table: sales table (``table`` or ``schema.table``); injection-shaped names are refused.
    :param warehouse_conn_id: warehouse connection: PostgreSQL, SQLite, or Google Cloud (BigQuery).
    :param max_reject_ratio: fail without loading (rejects are still recorded) above this ratio.
    :param lease_seconds: lease length; another run waits this long for a crashed holder.
    :param load_method: ``auto`` (COPY on PostgreSQL, INSERT on SQLite), ``copy``, ``insert``,
        ``executemany`` or ``to_sql``.
    :param bigquery_dataset: dataset of the table when the warehouse connection is BigQuery.
    :param bigquery_project: project when the warehouse is BigQuery (default: the connection's).
    :param bigquery_location: BigQuery job location.
    :param audit_conn_id: SQL connection keeping ``load_audit``/leases for a BigQuery warehouse.
    :param ledger_conn_id: work ledger connection: the ledger owns the partition's lease and its
        fencing token, and records the load's result. ``None``: the warehouse's own lease table
        fences (the behaviour before the ledger).
    :param storage_conn_id: the object storage of a ``gs://`` ``staging_dir`` (credentials, an
        emulator's endpoint); a local one never reads it.
    """

    template_fields: Sequence[str] = ("partition", "staging_dir", "table")
    ui_color = "#d7ecff"

    def __init__(
        self,
        *,
        partition: str,
        staging_dir: str | None,
        table: str = "daily_sales",
        warehouse_conn_id: str = "onceflow_warehouse",
        max_reject_ratio: float = 0.05,
        lease_seconds: int = 120,
        load_method: str = "auto",
        bigquery_dataset: str | None = None,
        bigquery_project: str | None = None,
        bigquery_location: str | None = None,
        audit_conn_id: str | None = None,
        ledger_conn_id: str | None = "onceflow_ledger",
        storage_conn_id: str = "onceflow_storage",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partition = partition
        self.staging_dir = staging_dir
        self.table = table
        self.warehouse_conn_id = warehouse_conn_id
        self.max_reject_ratio = max_reject_ratio
        self.lease_seconds = lease_seconds
        self.load_method = load_method
        self.bigquery_dataset = bigquery_dataset
        self.bigquery_project = bigquery_project
        self.bigquery_location = bigquery_location
        self.audit_conn_id = audit_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.storage_conn_id = storage_conn_id
        self._shutdown: GracefulShutdown | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.extras import require

        require("sales")  # before anything imports pandas: the log names the missing extra
        from onceflow.compat import AirflowFailException
        from onceflow.hooks.storage import StorageHook
        from onceflow.hooks.warehouse import WarehouseHook
        from onceflow.sales.partitions import validate_partition, validate_table_name
        from onceflow.sales.staging import (
            StagingFormatError,
            StagingMismatchError,
            open_clean,
            read_clean,
            run_dir,
        )

        day = validate_partition(self.partition)
        validate_table_name(self.table)
        warehouse = WarehouseHook(self.warehouse_conn_id)
        with contextlib.ExitStack() as stack:
            storage = StorageHook(self.storage_conn_id)
            if self.staging_dir:
                folder = storage.path(self.staging_dir)
            else:
                folder = run_dir(storage.sales_staging(), context["dag"].dag_id, day, context["run_id"])
            try:
                # SQL warehouses stream the rows from the staged file; BigQuery's load job takes a frame.
                staged = (
                    read_clean(folder) if warehouse.is_bigquery else stack.enter_context(open_clean(folder))
                )
            except (StagingMismatchError, StagingFormatError) as exc:
                raise AirflowFailException(str(exc)) from exc  # the files will not change by waiting
            if staged.partition != day:
                raise ValueError(f"staging folder {folder} holds partition {staged.partition}, not {day}")
            return self._execute(context, warehouse, staged, day)

    def _execute(self, context: Context, warehouse: Any, staged: Any, day: Any) -> dict[str, Any]:
        from onceflow.compat import AirflowFailException
        from onceflow.hooks.warehouse import WarehouseHook
        from onceflow.sales.deadlines import DeadlineExceeded
        from onceflow.sales.fencing import OlderExtractError

        bigquery = warehouse.is_bigquery
        audit_hook = WarehouseHook(self.audit_conn_id) if bigquery and self.audit_conn_id else warehouse
        if bigquery and not self.audit_conn_id:
            raise ValueError(
                "a BigQuery warehouse needs audit_conn_id: a SQL database for load_audit and leases"
            )
        store = audit_hook.get_store(self.table)
        run_id, try_number = context["run_id"], context["ti"].try_number
        try:
            # Before any lease: an extract older than the committed one never replaces it.
            store.check_extract_age(day, staged.source_watermark_utc)
            if self.ledger_conn_id is None:
                lease = store.acquire_lease(
                    day, run_id=run_id, try_number=try_number, lease_seconds=self.lease_seconds
                )
                self.log.info("partition %s of %s: fence token %s", day, self.table, lease.fence_token)
                try:
                    audit = self._load(store, warehouse, lease, staged, day, bigquery)
                except DeadlineExceeded as exc:
                    raise exc.noting(_warehouse_lease_note(lease)) from exc
            else:
                audit = self._load_through_ledger(context, store, warehouse, staged, day, bigquery)
        except OlderExtractError as exc:
            # Waiting cannot make this extract newer: no retries; re-running extract reads the shop again.
            raise AirflowFailException(str(exc)) from exc
        self.log.info(
            "loaded %s rows into %s partition %s, checksum %s",
            audit.row_count,
            self.table,
            day,
            audit.checksum,
        )
        self._annotate_outlets(context, audit)
        return {
            "table": audit.table_name,
            "partition": audit.partition_key,
            "row_count": audit.row_count,
            "reject_count": audit.reject_count,
            "checksum": audit.checksum,
            "fence_token": audit.fence_token,
        }

    def _load_through_ledger(
        self, context: Context, store: Any, warehouse: Any, staged: Any, day: Any, bigquery: bool
    ) -> AuditRecord:
        """Ledger lease -> token registered in the warehouse -> fenced overwrite -> ledger commit.

        The warehouse commit is the authority; a crash before the ledger commit is repaired by the
        ledger reconciler (``onceflow.sales.ledger_checks``) or by the task's retry.
        """
        from onceflow.compat import AirflowFailException
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.ledger import LeaseHeld
        from onceflow.sales.ledger_link import load_partition
        from onceflow.sales.partition_store import PartitionLeaseHeld
        from onceflow.shutdown import GracefulShutdown

        self._shutdown = GracefulShutdown()
        ti = context["ti"]
        run_id, try_number = context["run_id"], ti.try_number
        owner = f"{getattr(ti, 'dag_id', None) or self.dag_id}/{run_id}/{try_number}"
        assert self.ledger_conn_id is not None
        ledger = LedgerHook(self.ledger_conn_id).get_ledger()
        try:
            return load_partition(
                ledger,
                store,
                partition=day,
                owner=owner,
                run_id=run_id,
                try_number=try_number,
                processing_version=staged.processing_version,
                lease_seconds=self.lease_seconds,
                write=lambda lease: self._load(store, warehouse, lease, staged, day, bigquery),
                permanent=lambda exc: isinstance(exc, AirflowFailException),
                shutdown=self._shutdown,
            )
        except LeaseHeld as exc:
            raise PartitionLeaseHeld(str(exc)) from exc

    def on_kill(self) -> None:
        """Airflow is stopping the task (SIGTERM): hand the partition's ledger lease back at once.

        (Without a ledger, ``ledger_conn_id=None``, the warehouse's own lease expires as before.)
        """
        if self._shutdown is not None:
            self._shutdown.request()

    def _load(
        self,
        store: Any,
        warehouse: Any,
        lease: Any,
        staged: Any,
        day: Any,
        bigquery: bool,
    ) -> AuditRecord:
        from onceflow.compat import AirflowFailException

        if staged.reject_ratio > self.max_reject_ratio:
            store.record_rejects(
                lease, staged.reject_load_batches(), source_watermark_utc=staged.source_watermark_utc
            )
            raise AirflowFailException(
                f"{staged.reject_count} of {staged.source_rows} source rows rejected for {day} "
                f"({staged.reject_ratio:.1%} > max_reject_ratio {self.max_reject_ratio:.1%}); "
                f"partition left unchanged, reasons recorded in the rejects table"
            )

        if bigquery:
            if not self.bigquery_dataset:
                raise ValueError("bigquery_dataset is required for a BigQuery warehouse")
            store.check_load(lease, staged.source_watermark_utc)  # early; BigQuery checks again
            warehouse.overwrite_bigquery_partition(
                table=self.table,
                lease=lease,
                rows=staged.rows,
                project_id=self.bigquery_project,
                dataset=self.bigquery_dataset,
                location=self.bigquery_location,
                source_watermark_utc=staged.source_watermark_utc,
            )
            audit = store.record_external_load(
                lease,
                rows=staged.rows,
                rejects=staged.rejects,
                processing_version=staged.processing_version,
                source_watermark_utc=staged.source_watermark_utc,
                duplicate_count=staged.duplicates_dropped,
            )
        else:
            audit = store.overwrite(
                lease,
                staged.load_batches(),
                staged.reject_load_batches(),
                processing_version=staged.processing_version,
                method=self.load_method,
                source_watermark_utc=staged.source_watermark_utc,
                duplicate_count=staged.duplicates_dropped,
            )
        return audit

    def _annotate_outlets(self, context: Context, audit: AuditRecord) -> None:
        """Put the partition and checksum into the extra of each outlet Asset's event."""
        from airflow.sdk import Asset

        events = context.get("outlet_events")
        if events is None:
            return
        for outlet in self.outlets or []:
            if isinstance(outlet, Asset):
                events[outlet].extra = {
                    "table": audit.table_name,
                    "partition": audit.partition_key,
                    "row_count": audit.row_count,
                    "checksum": audit.checksum,
                }


def _warehouse_lease_note(lease: Any) -> str:
    """What a deadline left of a warehouse-mode lease (no work ledger): nothing hands it back."""
    return (
        f"Without a work ledger (ledger_conn_id=None) the partition's warehouse lease stays with run "
        f"{lease.run_id!r} until {lease.expires_at_utc.isoformat(sep=' ')} UTC: this run's retry takes it "
        "over at once, other runs of the partition wait for it to expire (lease_seconds)."
    )
