"""Fenced, atomic partition overwrite of the sales table in a SQL warehouse, with its audit.

The protocol of one load attempt (one Airflow task try):

1. :meth:`PartitionStore.acquire_lease` takes the partition's next **fence token** (a counter in
   ``load_lease``, incremented in a locked transaction) and a lease that expires. Another run's
   unexpired lease blocks it; a newer try of the same run takes over (Airflow gave up on the old
   try).
2. :meth:`PartitionStore.overwrite` is **one transaction**: lock the lease row
   (``SELECT ... FOR UPDATE`` on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite), refuse unless this
   attempt still holds the newest token, delete the partition, insert the new rows (COPY on
   PostgreSQL), replace the partition's rejects, upsert the ``load_audit`` row, commit. A crash at
   any point before the commit leaves the old rows; after it, the new ones. Never a mix.

A stale attempt (an older try, or an older run whose lease expired and was taken over) fails at
step 2 with :class:`StaleAttemptError`, even if it already wrote its rows inside its own
transaction: they are rolled back.

**Ledger-fenced loads** (what ``PartitionOverwriteOperator`` does): the work ledger owns the lease
and hands out the token; :meth:`PartitionStore.register_ledger_token` records it in ``load_fence``
(the highest token registered and the highest committed, per partition) and step 2 refuses a
token older than either, in the overwrite's transaction. ``load_lease`` then stays untouched:
the two token sequences never mix.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd
import sqlalchemy as sa

from onceflow.sales.checksum import frame_checksum, rows_checksum
from onceflow.sales.partitions import partition_key, validate_partition, validate_table_name
from onceflow.sales.schema import REJECT_COLUMNS, SALES_COLUMNS, sales_table, warehouse_tables

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

LoadMethod = Literal["auto", "copy", "insert", "executemany", "to_sql"]
Checkpoint = Callable[[str], None]
_EPOCH = dt.datetime(1970, 1, 1)


#: Advisory lock serialising table creation in one warehouse (PostgreSQL).
_SCHEMA_LOCK = "onceflow.warehouse.schema"


class StaleAttemptError(RuntimeError):
    """This attempt no longer holds the partition's newest fence token; its write is refused."""


def fence_table(metadata: sa.MetaData) -> sa.Table:
    """``load_fence``: per partition, the newest ledger token registered and the newest committed."""
    if "load_fence" in metadata.tables:
        return metadata.tables["load_fence"]
    return sa.Table(
        "load_fence",
        metadata,
        sa.Column("table_name", sa.String(128), primary_key=True),
        sa.Column("partition_key", sa.String(10), primary_key=True),
        sa.Column("work_key", sa.String(200), nullable=False),
        sa.Column("fence_token", sa.BigInteger, nullable=False),
        sa.Column("committed_token", sa.BigInteger, nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("updated_at_utc", sa.DateTime, nullable=False),
    )


class PartitionLeaseHeld(RuntimeError):
    """Another run holds an unexpired lease on the partition; try again later."""


def utcnow_naive() -> dt.datetime:
    """Wall clock for audit metadata only (``loaded_at``, lease expiry), never for results."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


@dataclasses.dataclass(frozen=True)
class Lease:
    """What an attempt holds after :meth:`PartitionStore.acquire_lease`."""

    table: str
    partition: dt.date
    fence_token: int
    run_id: str
    try_number: int
    expires_at_utc: dt.datetime
    #: ``warehouse``: token from ``load_lease``; ``ledger``: the work ledger's token (``load_fence``).
    fenced_by: str = "warehouse"
    work_key: str = ""


@dataclasses.dataclass(frozen=True)
class AuditRecord:
    """One ``load_audit`` row: the last committed load of one partition."""

    table_name: str
    partition_key: str
    row_count: int
    reject_count: int
    checksum: str
    run_id: str
    try_number: int
    fence_token: int
    processing_version: str
    loaded_at_utc: dt.datetime


def frame_records(df: pd.DataFrame, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows of ``df`` as tuples of plain Python values (ints, str, date, datetime, None)."""
    cols: list[list[Any]] = []
    for name in columns:
        series = df[name]
        if pd.api.types.is_datetime64_any_dtype(series):
            cols.append([None if pd.isna(v) else v.to_pydatetime() for v in series])
        elif pd.api.types.is_integer_dtype(series):
            cols.append(series.tolist())
        else:
            cols.append(
                [None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v for v in series]
            )
    return list(zip(*cols, strict=True)) if cols else []


def _csv_buffer(rows: pd.DataFrame) -> io.StringIO:
    """The rows as COPY-ready CSV (empty field = NULL), serialised by pandas rather than row by row."""
    buf = io.StringIO()
    rows.loc[:, list(SALES_COLUMNS)].to_csv(
        buf, index=False, header=False, date_format="%Y-%m-%d %H:%M:%S.%f", lineterminator="\n"
    )
    buf.seek(0)
    return buf


class PartitionStore:
    """The warehouse side of daily partition loads for one sales table.

    :param engine: warehouse engine (see :func:`onceflow.sales.engine.make_engine`).
    :param table: sales table name (``table`` or ``schema.table``); refused if not an identifier.
    :param clock: naive-UTC wall clock for lease expiry and ``loaded_at`` (tests pass a fake).
    """

    def __init__(
        self, engine: Engine, table: str = "daily_sales", *, clock: Callable[[], dt.datetime] = utcnow_naive
    ):
        self.engine = engine
        self.table_name = validate_table_name(table)
        self.clock = clock
        self.metadata = sa.MetaData()
        self.table = sales_table(self.table_name, self.metadata)
        self.rejects, self.audit_table, self.lease_table = warehouse_tables(self.metadata)
        self.fence = fence_table(self.metadata)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def create_schema(self) -> None:
        """Create the sales, rejects, audit and lease tables if they do not exist.

        Safe to call from many tasks at once (a backfill's first wave all call it): creators are
        serialised, on PostgreSQL by an advisory lock held to commit (its DDL is transactional, so
        the next creator then finds the tables), on SQLite by ``BEGIN IMMEDIATE``. Without it,
        concurrent ``CREATE TABLE``s of one name fail on PostgreSQL with a unique violation. One
        lock for the whole warehouse, not per sales table: the rejects, audit, lease and fence
        tables are shared by every sales table in it.
        """
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": _SCHEMA_LOCK})
            self.metadata.create_all(conn)

    # -- leases -------------------------------------------------------------------------------

    def _lock_lease(self, conn: Connection, key: str) -> Any:
        lt = self.lease_table
        stmt = sa.select(lt).where(lt.c.table_name == self.table_name, lt.c.partition_key == key)
        if self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).one_or_none()

    def _ensure_lease_row(self, conn: Connection, key: str) -> None:
        values = {
            "table_name": self.table_name,
            "partition_key": key,
            "fence_token": 0,
            "run_id": "",
            "try_number": 0,
            "expires_at_utc": _EPOCH,
        }
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            conn.execute(pg_insert(self.lease_table).values(**values).on_conflict_do_nothing())
        elif self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            conn.execute(sqlite_insert(self.lease_table).values(**values).on_conflict_do_nothing())
        else:
            raise NotImplementedError(f"partition loads support postgresql and sqlite, not {self.dialect}")

    def acquire_lease(
        self, partition: dt.date, *, run_id: str, try_number: int, lease_seconds: int = 3600
    ) -> Lease:
        """Take the partition's next fence token for this attempt.

        :param partition: business-local day.
        :param run_id: Airflow run id of the attempt.
        :param try_number: Airflow try number of the attempt.
        :param lease_seconds: how long other runs are kept out; longer than a load takes.
        :raises PartitionLeaseHeld: another run holds an unexpired lease.
        :raises StaleAttemptError: a newer try of the same run already took the partition.
        """
        key = partition_key(partition)
        now = self.clock()
        with self.engine.begin() as conn:
            self._ensure_lease_row(conn, key)
            row = self._lock_lease(conn, key)
            if row.run_id == run_id and row.try_number > try_number:
                raise StaleAttemptError(
                    f"{self.table_name} partition {key}: try {try_number} of run {run_id!r} is stale, "
                    f"try {row.try_number} already took the partition (fence token {row.fence_token})"
                )
            if row.run_id not in ("", run_id) and row.expires_at_utc > now:
                raise PartitionLeaseHeld(
                    f"{self.table_name} partition {key} is leased to run {row.run_id!r} try {row.try_number} "
                    f"until {row.expires_at_utc.isoformat()}Z; retry after it commits or expires"
                )
            token = int(row.fence_token) + 1
            expires = now + dt.timedelta(seconds=lease_seconds)
            lt = self.lease_table
            conn.execute(
                lt.update()
                .where(lt.c.table_name == self.table_name, lt.c.partition_key == key)
                .values(fence_token=token, run_id=run_id, try_number=try_number, expires_at_utc=expires)
            )
        return Lease(self.table_name, partition, token, run_id, try_number, expires)

    def _lock_fence(self, conn: Connection, key: str) -> Any:
        ft = self.fence
        stmt = sa.select(ft).where(ft.c.table_name == self.table_name, ft.c.partition_key == key)
        if self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).one_or_none()

    def register_ledger_token(
        self, partition: dt.date, *, token: int, work_key: str, run_id: str, try_number: int
    ) -> Lease:
        """Record the work ledger's fencing token for this attempt (the ledger granted the lease).

        From now on attempts with an older token are refused here, even before this one commits.

        :raises StaleAttemptError: a newer token is registered or committed already.
        """
        key = partition_key(partition)
        now = self.clock()
        values = {
            "table_name": self.table_name, "partition_key": key, "work_key": work_key, "fence_token": 0,
            "committed_token": 0, "run_id": "", "try_number": 0, "updated_at_utc": now,
        }  # fmt: skip
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as pg_insert

                conn.execute(pg_insert(self.fence).values(**values).on_conflict_do_nothing())
            else:
                from sqlalchemy.dialects.sqlite import insert as sqlite_insert

                conn.execute(sqlite_insert(self.fence).values(**values).on_conflict_do_nothing())
            row = self._lock_fence(conn, key)
            newest = max(int(row.fence_token), int(row.committed_token))
            if newest > token:
                raise StaleAttemptError(
                    f"{self.table_name} partition {key}: ledger token {token} of run {run_id!r} try "
                    f"{try_number} is stale, token {newest} (run {row.run_id!r} try {row.try_number}) "
                    "already took the partition"
                )
            ft = self.fence
            conn.execute(
                ft.update()
                .where(ft.c.table_name == self.table_name, ft.c.partition_key == key)
                .values(fence_token=token, work_key=work_key, run_id=run_id, try_number=try_number,
                        updated_at_utc=now)
            )  # fmt: skip
        return Lease(self.table_name, partition, token, run_id, try_number, now, "ledger", work_key)

    def _check_ledger_fence(self, conn: Connection, lease: Lease) -> None:
        row = self._lock_fence(conn, partition_key(lease.partition))
        newest = None if row is None else max(int(row.fence_token), int(row.committed_token))
        if newest is None or newest > lease.fence_token:
            who = "none" if row is None else f"{newest} (run {row.run_id!r} try {row.try_number})"
            raise StaleAttemptError(
                f"refusing to overwrite {self.table_name} partition {partition_key(lease.partition)}: "
                f"run {lease.run_id!r} try {lease.try_number} holds ledger token {lease.fence_token}, "
                f"the newest is {who}"
            )

    def _check_fence(self, conn: Connection, lease: Lease) -> None:
        if lease.fenced_by == "ledger":
            self._check_ledger_fence(conn, lease)
            return
        row = self._lock_lease(conn, partition_key(lease.partition))
        if row is None or int(row.fence_token) != lease.fence_token:
            newest = "none" if row is None else f"{row.fence_token} (run {row.run_id!r} try {row.try_number})"
            raise StaleAttemptError(
                f"refusing to overwrite {self.table_name} partition {partition_key(lease.partition)}: "
                f"run {lease.run_id!r} try {lease.try_number} holds fence token {lease.fence_token}, "
                f"the newest is {newest}"
            )

    # -- writes -------------------------------------------------------------------------------

    def overwrite(
        self,
        lease: Lease,
        rows: pd.DataFrame,
        rejects: pd.DataFrame | None = None,
        *,
        processing_version: str,
        method: LoadMethod = "auto",
        checkpoint: Checkpoint | None = None,
    ) -> AuditRecord:
        """Replace the partition with ``rows`` (and its rejects) in one fenced transaction.

        :param lease: the attempt's lease from :meth:`acquire_lease`.
        :param rows: sales rows (columns :data:`SALES_COLUMNS`), all in ``lease.partition``.
        :param rejects: reject rows (columns :data:`REJECT_COLUMNS`) for the partition, or None.
        :param processing_version: version of the code and reference data that produced ``rows``.
        :param method: how rows are inserted; ``auto`` is COPY on PostgreSQL, INSERT elsewhere.
        :param checkpoint: called with ``"deleted"`` and ``"rows_written"`` inside the transaction
            and ``"committed"`` after it (crash tests pause there).
        :raises StaleAttemptError: a newer attempt holds the partition; nothing is written.
        """
        key = partition_key(lease.partition)
        wrong = {d for d in rows["partition_date"].unique() if d != lease.partition}
        if wrong:
            raise ValueError(f"rows for partitions {sorted(map(str, wrong))} in a load of partition {key}")
        reject_records = frame_records(rejects, REJECT_COLUMNS) if rejects is not None else []
        checksum = frame_checksum(rows, SALES_COLUMNS)
        notify = checkpoint or (lambda _stage: None)
        with self.engine.begin() as conn:
            self._check_fence(conn, lease)
            conn.execute(self.table.delete().where(self.table.c.partition_date == lease.partition))
            notify("deleted")
            self._insert(conn, rows, method)
            notify("rows_written")
            self._replace_rejects(conn, key, reject_records)
            audit = AuditRecord(
                table_name=self.table_name,
                partition_key=key,
                row_count=len(rows),
                reject_count=len(reject_records),
                checksum=checksum,
                run_id=lease.run_id,
                try_number=lease.try_number,
                fence_token=lease.fence_token,
                processing_version=processing_version,
                loaded_at_utc=self.clock(),
            )
            self._upsert_audit(conn, audit, lease)
        notify("committed")
        return audit

    def record_rejects(self, lease: Lease, rejects: pd.DataFrame) -> None:
        """Replace only the partition's rejects (fenced), leaving its rows and audit untouched.

        Used when a load is refused for too many rejects: the reasons land where users look.
        """
        with self.engine.begin() as conn:
            self._check_fence(conn, lease)
            self._replace_rejects(
                conn, partition_key(lease.partition), frame_records(rejects, REJECT_COLUMNS)
            )
            if lease.fenced_by == "warehouse":
                self._release_key(conn, partition_key(lease.partition))

    def check_fence(self, lease: Lease) -> None:
        """Raise :class:`StaleAttemptError` unless ``lease`` still holds the newest token."""
        with self.engine.begin() as conn:
            self._check_fence(conn, lease)

    def record_external_load(
        self,
        lease: Lease,
        *,
        rows: pd.DataFrame,
        rejects: pd.DataFrame | None,
        processing_version: str,
    ) -> AuditRecord:
        """Fenced audit and rejects commit for a partition written to another system (BigQuery).

        The overwrite itself happened outside this database, so this transaction cannot include
        it: the fence is checked before the external job and again here.
        """
        reject_records = frame_records(rejects, REJECT_COLUMNS) if rejects is not None else []
        key = partition_key(lease.partition)
        with self.engine.begin() as conn:
            self._check_fence(conn, lease)
            self._replace_rejects(conn, key, reject_records)
            audit = AuditRecord(
                table_name=self.table_name,
                partition_key=key,
                row_count=len(rows),
                reject_count=len(reject_records),
                checksum=frame_checksum(rows, SALES_COLUMNS),
                run_id=lease.run_id,
                try_number=lease.try_number,
                fence_token=lease.fence_token,
                processing_version=processing_version,
                loaded_at_utc=self.clock(),
            )
            self._upsert_audit(conn, audit, lease)
        return audit

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

    def _insert(self, conn: Connection, rows: pd.DataFrame, method: LoadMethod) -> None:
        if rows.empty:
            return
        if method == "auto":
            method = "copy" if self.dialect == "postgresql" else "insert"
        if method == "copy":
            self._copy(conn, rows)
            return
        if method == "insert":
            records = frame_records(rows, SALES_COLUMNS)
            conn.execute(self.table.insert(), [dict(zip(SALES_COLUMNS, r, strict=True)) for r in records])
        elif method == "executemany":
            records = frame_records(rows, SALES_COLUMNS)
            placeholders = ", ".join(["%s" if self.dialect == "postgresql" else "?"] * len(SALES_COLUMNS))
            sql = f"INSERT INTO {self._quoted_table()} ({', '.join(SALES_COLUMNS)}) VALUES ({placeholders})"
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.executemany(sql, records)
            finally:
                cursor.close()
        elif method == "to_sql":
            schema, _, name = self.table_name.rpartition(".")
            rows.to_sql(name, conn, schema=schema or None, if_exists="append", index=False, chunksize=10_000)
        else:
            raise ValueError(f"unknown load method {method!r}")

    def _quoted_table(self) -> str:
        return self.engine.dialect.identifier_preparer.format_table(self.table)

    def _copy(self, conn: Connection, rows: pd.DataFrame) -> None:
        if self.dialect != "postgresql":
            raise ValueError("COPY loads need PostgreSQL")
        sql = f"COPY {self._quoted_table()} ({', '.join(SALES_COLUMNS)}) FROM STDIN WITH (FORMAT csv)"
        buf = _csv_buffer(rows)
        dbapi = conn.connection.dbapi_connection
        cursor = dbapi.cursor()  # type: ignore[union-attr]
        try:
            if self.engine.dialect.driver == "psycopg2":
                cursor.copy_expert(sql, buf)
            else:  # psycopg 3
                with cursor.copy(sql) as copy:
                    for chunk in iter(lambda: buf.read(1 << 20), ""):
                        copy.write(chunk)
        finally:
            cursor.close()

    def _replace_rejects(self, conn: Connection, key: str, reject_records: list[tuple[Any, ...]]) -> None:
        rj = self.rejects
        conn.execute(rj.delete().where(rj.c.table_name == self.table_name, rj.c.partition_key == key))
        if reject_records:
            conn.execute(
                rj.insert(),
                [
                    {
                        "table_name": self.table_name,
                        "partition_key": key,
                        **dict(zip(REJECT_COLUMNS, r, strict=True)),
                    }
                    for r in reject_records
                ],
            )

    def _release_key(self, conn: Connection, key: str) -> None:
        # Expire the lease at commit so another run may load the partition right away; the row
        # keeps the token, run and try, so older attempts stay fenced out.
        lt = self.lease_table
        conn.execute(
            lt.update()
            .where(lt.c.table_name == self.table_name, lt.c.partition_key == key)
            .values(expires_at_utc=self.clock())
        )

    def _upsert_audit(self, conn: Connection, audit: AuditRecord, lease: Lease) -> None:
        if lease.fenced_by == "ledger":
            ft = self.fence
            conn.execute(
                ft.update()
                .where(ft.c.table_name == self.table_name, ft.c.partition_key == audit.partition_key)
                .values(committed_token=audit.fence_token, updated_at_utc=audit.loaded_at_utc)
            )
        else:
            self._release_key(conn, audit.partition_key)
        at = self.audit_table
        values = dataclasses.asdict(audit)
        conn.execute(
            at.delete().where(at.c.table_name == audit.table_name, at.c.partition_key == audit.partition_key)
        )
        conn.execute(at.insert().values(**values))

    # -- reads --------------------------------------------------------------------------------

    def audit(self, partition: dt.date | str) -> AuditRecord | None:
        """The partition's audit row, or None if it was never loaded."""
        key = partition if isinstance(partition, str) else partition_key(partition)
        validate_partition(key)
        at = self.audit_table
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(at).where(at.c.table_name == self.table_name, at.c.partition_key == key)
            ).one_or_none()
        return None if row is None else AuditRecord(**row._asdict())

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
        """``(work_key, audit)`` of every partition whose current audit row a ledger token wrote."""
        at, ft = self.audit_table, self.fence
        stmt = (
            sa.select(ft.c.work_key, at)
            .join(ft, sa.and_(ft.c.table_name == at.c.table_name, ft.c.partition_key == at.c.partition_key,
                              ft.c.committed_token == at.c.fence_token, ft.c.run_id == at.c.run_id))
            .where(at.c.table_name == self.table_name)
            .order_by(at.c.partition_key)
        )  # fmt: skip
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [
            (r.work_key, AuditRecord(**{k: v for k, v in r._asdict().items() if k != "work_key"}))
            for r in rows
        ]

    def audits(self) -> Iterator[AuditRecord]:
        """All audit rows of this table, by partition."""
        at = self.audit_table
        stmt = sa.select(at).where(at.c.table_name == self.table_name).order_by(at.c.partition_key)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        for row in rows:
            yield AuditRecord(**row._asdict())
