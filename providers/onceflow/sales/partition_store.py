"""Fenced, atomic partition overwrite of the sales table in a SQL warehouse, with its audit.

The protocol of one load attempt (one Airflow task try):

1. The attempt takes the partition's next **fence token** (:mod:`onceflow.sales.fencing`): from
   the work ledger's lease (:meth:`PartitionStore.register_ledger_token`) or from the warehouse's
   own lease (:meth:`PartitionStore.acquire_lease`). One token sequence per partition, both modes.
2. :meth:`PartitionStore.overwrite` is **one transaction**: lock the partition's fence row, refuse
   unless this attempt holds the newest token, refuse an extract older than the committed one,
   delete the partition, insert the new rows (COPY on PostgreSQL, :mod:`onceflow.sales.bulk_load`),
   replace the partition's rejects, replace its ``load_audit`` row, commit. A crash at any point
   before the commit leaves the old rows; after it, the new ones. Never a mix.

A stale attempt (an older try, an older run whose lease expired and was taken over, a writer of
either mode after a newer attempt of the other) fails at step 2 with :class:`StaleAttemptError`,
even if it already wrote its rows inside its own transaction: they are rolled back.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.sales.audit import AuditRecord, describe_watermark, read_audit, replace_audit
from onceflow.sales.bulk_load import (
    LoadMethod,
    copy_chunks,
    copy_text,
    copy_text_and_digests,
    frame_records,
    insert_rows,
)
from onceflow.sales.checksum import (
    RowDigests,
    arrow_texts,
    frame_checksum,
    rows_checksum,
)
from onceflow.sales.fencing import (
    Lease,
    OlderExtractError,
    PartitionFence,
    PartitionLeaseHeld,
    StaleAttemptError,
)
from onceflow.sales.partitions import partition_key, validate_partition
from onceflow.sales.schema import REJECT_COLUMNS, SALES_COLUMNS, sales_table, warehouse_tables
from onceflow.sales.schema_upgrade import upgrade
from onceflow.sales.table_names import resolve_table
from onceflow.sales.text_staging import SALES_KINDS, copy_lines

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeAlias, TypeGuard

    import pandas as pd
    from sqlalchemy.engine import Connection, Engine

    #: reject rows (columns :data:`REJECT_COLUMNS`): one frame, or frames or Arrow record batches.
    Rejects: TypeAlias = pd.DataFrame | Iterable[Any]

__all__ = [
    "AuditRecord",
    "Checkpoint",
    "Lease",
    "LoadMethod",
    "OlderExtractError",
    "PartitionLeaseHeld",
    "PartitionStore",
    "StaleAttemptError",
    "frame_records",
    "utcnow_naive",
]

Checkpoint = Callable[[str], None]

#: reject rows inserted per statement (a day's rejects are not held as rows at once).
REJECT_INSERT_ROWS = 10_000
#: Advisory lock serialising table creation in one warehouse (PostgreSQL).
_SCHEMA_LOCK = "onceflow.warehouse.schema"


def _release_arrow_memory() -> None:
    """Hand the memory Arrow's pool keeps after a batch back to the system (mimalloc holds freed
    pages; without this a load's RSS grows by about 50 MB per million rows)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def is_frame(value: object) -> TypeGuard[pd.DataFrame]:
    """Whether ``value`` is a pandas DataFrame, without importing pandas: a process that never
    loaded it (the load task, streaming Arrow batches) holds no frame, and pandas costs ~0.2 s."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def _as_frame(batch: Any) -> pd.DataFrame:
    """A batch of sales rows as a normalised frame (Arrow batches converted)."""
    from onceflow.sales.clean import normalise_sales_frame

    return batch if is_frame(batch) else normalise_sales_frame(batch.to_pandas())


def is_row_list(value: object) -> TypeGuard[list[Sequence[Any]]]:
    """Whether a batch is a list of rows of plain Python values (a day staged as text,
    :class:`onceflow.sales.staging.TextClean`): loaded without Arrow, numpy or pandas."""
    return isinstance(value, list)


def _reject_records(batch: Any, start: int, length: int) -> list[dict[str, Any]]:
    """Rows ``start`` to ``start + length`` of a batch of rejects (a frame, an Arrow record batch
    or a list of rows) as dicts of :data:`REJECT_COLUMNS` holding plain Python values, NULL as None."""
    if is_row_list(batch):
        return [dict(zip(REJECT_COLUMNS, r, strict=True)) for r in batch[start : start + length]]
    if is_frame(batch):
        rows = frame_records(batch.iloc[start : start + length], REJECT_COLUMNS)
        return [dict(zip(REJECT_COLUMNS, r, strict=True)) for r in rows]
    records: list[dict[str, Any]] = batch.slice(start, length).select(list(REJECT_COLUMNS)).to_pylist()
    return records


def utcnow_naive() -> dt.datetime:
    """This process's wall clock, naive UTC (pass it as ``clock`` for a warehouse only this
    process uses; the default is the database's clock)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class PartitionStore:
    """The warehouse side of daily partition loads for one sales table.

    :param engine: warehouse engine (see :func:`onceflow.sales.engine.make_engine`).
    :param table: sales table name (``table`` or ``schema.table``); refused if not an identifier.
    :param clock: naive-UTC clock for lease expiry and ``loaded_at`` (tests pass a fake); None
        (default): the warehouse database's clock, read in each transaction
        (:meth:`~onceflow.sales.fencing.PartitionFence.now`), so workers' clocks never decide leases.
    """

    def __init__(
        self, engine: Engine, table: str = "daily_sales", *, clock: Callable[[], dt.datetime] | None = None
    ):
        self.engine = engine
        # Resolved before any fence: one physical table, one fence name (table_names).
        self.resolved = resolve_table(engine, table)
        self.table_name = self.resolved.fence_name
        self.clock = clock
        self.metadata = sa.MetaData()
        self.table = sales_table(self.resolved.statement_name, self.metadata)
        self.tables = warehouse_tables(self.metadata)
        self.rejects, self.audit_table, self.fence = self.tables
        self.fencing = PartitionFence(self.table_name, self.fence, self.dialect, clock)

    @property
    def dialect(self) -> str:
        """The warehouse's SQL dialect name (``postgresql`` or ``sqlite``)."""
        return self.engine.dialect.name

    def create_schema(self) -> None:
        """Create the sales, rejects, audit and fence tables if missing; upgrade older ones in place.

        Safe to call from many tasks at once (a backfill's first wave all call it): creators are
        serialised, on PostgreSQL by an advisory lock held to commit (its DDL is transactional, so
        the next creator then finds the tables), on SQLite by ``BEGIN IMMEDIATE``. Without it,
        concurrent ``CREATE TABLE``s of one name fail on PostgreSQL with a unique violation. One
        lock for the whole warehouse, not per sales table: the rejects, audit and fence tables are
        shared by every sales table in it.
        """
        if self.dialect == "postgresql" and self.schema_is_current():
            return  # every load calls this: no warehouse-wide lock when there is nothing to do
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": _SCHEMA_LOCK})
            upgrade(conn, self.tables)
            self.metadata.create_all(conn)

    def schema_is_current(self) -> bool:
        """PostgreSQL: every table of this store exists with every column (one catalog read, no lock).

        ``create_schema`` would then change nothing: the upgrade adds columns and moves their data
        in one transaction (PostgreSQL's DDL is transactional), so a column that is visible was
        committed together with its data, and ``create_all`` skips tables that exist. Each name is
        resolved by ``to_regclass`` as the loads' own statements resolve it (search path, an
        explicit schema, quoting), not by guessing the schema.
        """
        preparer = self.engine.dialect.identifier_preparer
        wanted = {
            preparer.format_table(t): {c.name for c in t.columns} for t in self.metadata.tables.values()
        }
        query = sa.text(
            "SELECT t.name, a.attname FROM unnest(CAST(:names AS text[])) AS t(name) "
            "JOIN pg_class c ON c.oid = to_regclass(t.name) "
            # a table or view, as the old check (has_table) counted; not a type, an index, or a
            # session's temporary table shadowing the real one on this pooled connection
            "AND c.relkind IN ('r', 'p', 'v', 'f') AND c.relpersistence <> 't' "
            "JOIN pg_attribute a ON a.attrelid = c.oid "
            "WHERE a.attnum > 0 AND NOT a.attisdropped"
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query, {"names": sorted(wanted)}).all()
        found: dict[str, set[str]] = {}
        for name, column in rows:
            found.setdefault(name, set()).add(column)
        return all(columns <= found.get(name, set()) for name, columns in wanted.items())

    # -- the fence ----------------------------------------------------------------------------

    def acquire_lease(
        self, partition: dt.date, *, run_id: str, try_number: int, lease_seconds: int = 3600
    ) -> Lease:
        """Warehouse mode: take the partition's next fence token and a lease for this attempt.

        :param partition: business-local day.
        :param run_id: Airflow run id of the attempt.
        :param try_number: Airflow try number of the attempt.
        :param lease_seconds: how long other runs are kept out; longer than a load takes.
        :raises PartitionLeaseHeld: another run holds an unexpired lease.
        :raises StaleAttemptError: a newer try of the same run already took the partition.
        """
        with self.engine.begin() as conn:
            return self.fencing.acquire(
                conn, partition, run_id=run_id, try_number=try_number, lease_seconds=lease_seconds
            )

    def register_ledger_token(
        self, partition: dt.date, *, token: int, work_key: str, run_id: str, try_number: int
    ) -> Lease:
        """Ledger mode: record the work ledger's token for this attempt and take the next fence token.

        From now on every older attempt, of either mode, is refused here.

        :raises StaleAttemptError: a newer ledger token is registered already.
        """
        with self.engine.begin() as conn:
            return self.fencing.register_ledger(
                conn, partition, token=token, work_key=work_key, run_id=run_id, try_number=try_number
            )

    def check_fence(self, lease: Lease) -> None:
        """Raise :class:`StaleAttemptError` unless ``lease`` still holds the newest token."""
        with self.engine.begin() as conn:
            self.fencing.check(conn, lease)

    # -- writes -------------------------------------------------------------------------------

    def overwrite(
        self,
        lease: Lease,
        rows: pd.DataFrame | Iterable[Any],
        rejects: Rejects | None = None,
        *,
        processing_version: str,
        method: LoadMethod = "auto",
        checkpoint: Checkpoint | None = None,
        source_watermark_utc: dt.datetime | None = None,
        duplicate_count: int | None = None,
    ) -> AuditRecord:
        """Replace the partition with ``rows`` (and its rejects) in one fenced transaction.

        :param lease: the attempt's lease (:meth:`acquire_lease` or :meth:`register_ledger_token`).
        :param rows: sales rows (columns :data:`SALES_COLUMNS`), all in ``lease.partition``: one
            frame, or frames or Arrow record batches streamed batch by batch (e.g.
            :meth:`StreamedClean.arrow_batches <onceflow.sales.staging.StreamedClean.arrow_batches>`),
            each inserted and added to the checksum as it arrives, so memory holds a few batches and
            32 bytes a row (spilled to a temporary file past ``checksum.SPILL_ROWS`` rows). On
            PostgreSQL the rows go into one COPY, Arrow batches formatted by Arrow.
        :param rejects: reject rows (columns :data:`REJECT_COLUMNS`) for the partition: one frame,
            or frames or Arrow record batches inserted batch by batch (e.g.
            :meth:`StreamedClean.reject_arrow_batches
            <onceflow.sales.staging.StreamedClean.reject_arrow_batches>`), or None.
        :param processing_version: version of the code and reference data that produced ``rows``.
        :param method: how rows are inserted; ``auto`` is COPY on PostgreSQL, INSERT elsewhere.
        :param checkpoint: called with ``"deleted"`` and ``"rows_written"`` inside the transaction
            and ``"committed"`` after it (crash tests pause there).
        :param source_watermark_utc: when the extract behind ``rows`` read the shop (naive UTC).
        :param duplicate_count: exact repeats cleaning dropped (recorded in ``load_audit``).
        :raises StaleAttemptError: a newer attempt holds the partition; nothing is written.
        :raises OlderExtractError: the committed load read the shop later; nothing is written.
        """
        batches: Iterable[Any] = [rows] if is_frame(rows) else rows
        if is_frame(rows):
            # Before any transaction, for one frame.
            self._check_partition(lease, self._dates_of(rows))
        digests = RowDigests(SALES_COLUMNS)
        notify = checkpoint or (lambda _stage: None)
        if method == "auto":
            method = "copy" if self.dialect == "postgresql" else "insert"
        try:
            with self.engine.begin() as conn:
                self._check(conn, lease, source_watermark_utc)
                conn.execute(self.table.delete().where(self.table.c.partition_date == lease.partition))
                notify("deleted")
                if method == "copy":
                    # One COPY; a second thread reads, checks, formats and checksums the next batch
                    # while this one sends (bulk_load.copy_chunks).
                    quoted = conn.dialect.identifier_preparer.format_table(self.table)
                    copy_chunks(conn, quoted, self._copy_text(lease, batches, digests))
                else:
                    for batch in batches:
                        if method == "insert" and is_row_list(batch):
                            self._check_partition(lease, (row[0] for row in batch))
                            if batch:
                                conn.execute(
                                    self.table.insert(),
                                    [dict(zip(SALES_COLUMNS, r, strict=True)) for r in batch],
                                )
                            digests.add_rows(batch)
                            continue
                        if is_row_list(batch):  # the baselines' methods take frames
                            from onceflow.sales.clean import sales_rows_frame

                            batch = sales_rows_frame(batch)
                        if method == "insert" and not is_frame(batch):
                            # Arrow batches as plain values: no pandas in the load's process.
                            self._check_partition(lease, self._dates_of(batch))
                            if batch.num_rows:
                                conn.execute(
                                    self.table.insert(), batch.select(list(SALES_COLUMNS)).to_pylist()
                                )
                            digests.add_arrow(batch)
                            continue
                        frame = _as_frame(batch)
                        # A wrong row rolls the whole load back.
                        self._check_partition(lease, self._dates_of(frame))
                        insert_rows(conn, self.table, frame, method)
                        digests.add(frame)
                notify("rows_written")
                audit = self._commit_audit(
                    conn, lease, row_count=digests.rows, checksum=digests.hexdigest(), rejects=rejects,
                    processing_version=processing_version, source_watermark_utc=source_watermark_utc,
                    duplicate_count=duplicate_count,
                )  # fmt: skip
        finally:
            digests.close()
        notify("committed")
        return audit

    def _copy_text(self, lease: Lease, batches: Iterable[Any], digests: RowDigests) -> Iterator[bytes | str]:
        """Each batch checked, added to the checksum and formatted as COPY text (Arrow batches
        column-wise by Arrow, frames by pandas)."""
        for batch in batches:
            if is_row_list(batch):  # plain Python rows, formatted here: no Arrow in the process
                self._check_partition(lease, (row[0] for row in batch))
                digests.add_rows(batch)
                yield copy_lines(batch, SALES_KINDS)
                continue
            if is_frame(batch):
                self._check_partition(lease, self._dates_of(batch))
                digests.add(batch)
                yield copy_text(batch).getvalue()
                continue
            self._check_partition(lease, self._dates_of(batch))
            texts = arrow_texts(batch, SALES_COLUMNS)  # each column's text once, for both uses
            if texts is None:  # a column type Arrow does not format here
                frame = _as_frame(batch)
                digests.add(frame)
                yield copy_text(frame).getvalue()
            else:
                text, packed = copy_text_and_digests(texts)
                digests.add_digests(packed)
                del texts, batch
                _release_arrow_memory()
                yield text

    @staticmethod
    def _check_partition(lease: Lease, dates: Iterable[Any]) -> None:
        """Refuse ``dates`` (a batch's ``partition_date`` values) unless all are the lease's partition."""
        wrong = {d for d in dates if d != lease.partition}
        if wrong:
            key = partition_key(lease.partition)
            raise ValueError(f"rows for partitions {sorted(map(str, wrong))} in a load of partition {key}")

    @staticmethod
    def _dates_of(batch: Any) -> Iterable[Any]:
        """The distinct ``partition_date`` values of a frame or an Arrow batch (for :meth:`_check_partition`)."""
        if is_frame(batch):
            return batch["partition_date"].unique()
        import pyarrow.compute as pc

        return pc.unique(batch.column("partition_date")).to_pylist()

    def record_rejects(
        self,
        lease: Lease,
        rejects: Rejects,
        *,
        source_watermark_utc: dt.datetime | None = None,
    ) -> None:
        """Replace only the partition's rejects (fenced), leaving its rows untouched.

        Used when a load is refused for too many rejects: the reasons land where users look. The
        partition's audit row, if any, gets the new reject count in the same transaction, so
        ``load_audit.reject_count`` always counts the partition's rows in ``rejects``.

        :param source_watermark_utc: when the extract behind ``rejects`` read the shop; checked
            like :meth:`overwrite`'s, so an older extract never replaces a newer load's rejects.
        :raises StaleAttemptError: a newer attempt holds the partition; nothing is written.
        :raises OlderExtractError: the committed load read the shop later; nothing is written.
        """
        key = partition_key(lease.partition)
        with self.engine.begin() as conn:
            self._check(conn, lease, source_watermark_utc)
            count = self._replace_rejects(conn, key, rejects)
            at = self.audit_table
            conn.execute(
                at.update()
                .where(at.c.table_name == self.table_name, at.c.partition_key == key)
                .values(reject_count=count)
            )
            self.fencing.release(conn, lease)

    def record_external_load(
        self,
        lease: Lease,
        *,
        rows: pd.DataFrame,
        rejects: pd.DataFrame | None,
        processing_version: str,
        source_watermark_utc: dt.datetime | None = None,
        duplicate_count: int | None = None,
    ) -> AuditRecord:
        """Fenced audit and rejects commit for a partition written to another system (BigQuery).

        The partition itself was replaced by the other system's own fenced transaction
        (:mod:`onceflow.sales.bigquery`); this commits the audit under the same fence token.
        """
        with self.engine.begin() as conn:
            self._check(conn, lease, source_watermark_utc)
            return self._commit_audit(
                conn, lease, row_count=len(rows), checksum=frame_checksum(rows, SALES_COLUMNS), rejects=rejects,
                processing_version=processing_version, source_watermark_utc=source_watermark_utc,
                duplicate_count=duplicate_count,
            )  # fmt: skip

    def check_load(self, lease: Lease, source_watermark_utc: dt.datetime | None) -> None:
        """Raise now if :meth:`overwrite` would refuse this attempt (fence or extract age)."""
        with self.engine.begin() as conn:
            self._check(conn, lease, source_watermark_utc)

    def append(
        self, rows: pd.DataFrame, *, chunk_size: int = 1000, checkpoint: Checkpoint | None = None
    ) -> None:
        """The naive load this module exists to replace: append rows, committing each chunk.

        Kept for the crash experiment that shows the duplicates a retried append produces.
        """
        records = frame_records(rows, SALES_COLUMNS)
        for i in range(0, len(records), chunk_size):
            with self.engine.begin() as conn:
                conn.execute(
                    self.table.insert(),
                    [dict(zip(SALES_COLUMNS, r, strict=True)) for r in records[i : i + chunk_size]],
                )
            if checkpoint is not None:
                checkpoint(f"chunk_committed:{i // chunk_size}")

    def check_extract_age(self, partition: dt.date, source_watermark_utc: dt.datetime | None) -> None:
        """Raise :class:`OlderExtractError` now if the partition holds a newer extract.

        A cheap early answer before any lease is taken; :meth:`overwrite` checks again under the
        fence lock.
        """
        with self.engine.connect() as conn:
            self._check_extract(conn, partition_key(partition), source_watermark_utc)

    def _check(self, conn: Connection, lease: Lease, watermark: dt.datetime | None) -> None:
        """The fence, then the extract's age against the committed load's, under the fence lock."""
        self.fencing.check(conn, lease)
        self._check_extract(conn, partition_key(lease.partition), watermark)

    def _check_extract(self, conn: Connection, key: str, watermark: dt.datetime | None) -> None:
        committed = read_audit(conn, self.audit_table, self.table_name, key)
        if committed is None or committed.source_watermark_utc is None:
            return
        if watermark is None or watermark < committed.source_watermark_utc:
            raise OlderExtractError(
                f"refusing to load {self.table_name} partition {key} from an extract that read the shop at "
                f"{describe_watermark(watermark)}: the partition already holds run {committed.run_id!r}'s "
                f"extract, read at {describe_watermark(committed.source_watermark_utc)}, which is newer. "
                "Clear this run's extract task (not only load) to read the shop again."
            )

    def _commit_audit(
        self,
        conn: Connection,
        lease: Lease,
        *,
        row_count: int,
        checksum: str,
        rejects: Rejects | None,
        processing_version: str,
        source_watermark_utc: dt.datetime | None,
        duplicate_count: int | None = None,
    ) -> AuditRecord:
        key = partition_key(lease.partition)
        reject_count = self._replace_rejects(conn, key, rejects)
        now = self.fencing.now(conn)
        audit = AuditRecord(
            table_name=self.table_name,
            partition_key=key,
            row_count=row_count,
            reject_count=reject_count,
            checksum=checksum,
            run_id=lease.run_id,
            try_number=lease.try_number,
            fence_token=lease.fence_token,
            processing_version=processing_version,
            loaded_at_utc=now,
            ledger_token=lease.ledger_token,
            source_watermark_utc=source_watermark_utc,
            duplicate_count=duplicate_count,
        )
        replace_audit(conn, self.audit_table, audit)
        self.fencing.mark_committed(conn, lease, now)
        return audit

    def _replace_rejects(self, conn: Connection, key: str, rejects: Rejects | None) -> int:
        """Replace the partition's rejects with ``rejects`` (a frame, or frames or Arrow record
        batches, inserted :data:`REJECT_INSERT_ROWS` at a time, so memory holds one batch);
        returns how many."""
        rj = self.rejects
        conn.execute(rj.delete().where(rj.c.table_name == self.table_name, rj.c.partition_key == key))
        batches: Iterable[Any] = [] if rejects is None else [rejects] if is_frame(rejects) else rejects
        count = 0
        for batch in batches:
            for start in range(0, len(batch), REJECT_INSERT_ROWS):
                records = _reject_records(batch, start, REJECT_INSERT_ROWS)
                conn.execute(
                    rj.insert(),
                    [{"table_name": self.table_name, "partition_key": key, **record} for record in records],
                )
                count += len(records)
        return count

    # -- reads --------------------------------------------------------------------------------

    def audit(self, partition: dt.date | str) -> AuditRecord | None:
        """The partition's audit row, or None if it was never loaded."""
        key = partition if isinstance(partition, str) else partition_key(partition)
        validate_partition(key)
        with self.engine.connect() as conn:
            return read_audit(conn, self.audit_table, self.table_name, key)

    def partition_rows(self, partition: dt.date) -> list[tuple[Any, ...]]:
        """The partition's rows as read back from the warehouse, in order-id order."""
        cols = [self.table.c[c] for c in SALES_COLUMNS]
        stmt = (
            sa.select(*cols).where(self.table.c.partition_date == partition).order_by(self.table.c.order_id)
        )
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(stmt)]

    def partition_checksum(self, partition: dt.date) -> str:
        """Checksum of the rows currently in the warehouse (same function as the audit's)."""
        return rows_checksum(self.partition_rows(partition))

    def partition_rejects(self, partition: dt.date) -> list[dict[str, Any]]:
        """The partition's reject rows, ordered by source row id."""
        rj = self.rejects
        stmt = (
            sa.select(rj.c.source_row_id, rj.c.order_id, rj.c.reason, rj.c.raw)
            .where(rj.c.table_name == self.table_name, rj.c.partition_key == partition_key(partition))
            .order_by(rj.c.source_row_id)
        )
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def ledger_commits(self) -> list[tuple[str, AuditRecord]]:
        """``(work_key, audit)`` of every partition whose current audit row a ledger-fenced load wrote."""
        at, ft = self.audit_table, self.fence
        stmt = (
            sa.select(ft.c.work_key, at)
            .join(ft, sa.and_(ft.c.table_name == at.c.table_name, ft.c.partition_key == at.c.partition_key))
            .where(at.c.table_name == self.table_name, at.c.ledger_token.is_not(None))
            .order_by(at.c.partition_key)
        )  # fmt: skip
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [(r.work_key, AuditRecord.from_row(r)) for r in rows]

    def audits(self) -> Iterator[AuditRecord]:
        """All audit rows of this table, by partition."""
        at = self.audit_table
        stmt = sa.select(at).where(at.c.table_name == self.table_name).order_by(at.c.partition_key)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        for row in rows:
            yield AuditRecord.from_row(row)
