"""One fence per partition: who may overwrite it, checked inside every overwrite's transaction.

``load_fence`` keeps, per (sales table, partition), one token sequence. Every attempt takes the
next token, whichever mode fences it:

* **ledger mode** (what ``PartitionOverwriteOperator`` does): the work ledger grants the lease;
  :meth:`PartitionFence.register_ledger` records the ledger's token and takes the next fence
  token. An attempt whose ledger token is older than one already registered is refused there
  (it lost its ledger lease before registering).
* **warehouse mode** (``ledger_conn_id=None``, benchmarks, the day-by-day comparison):
  :meth:`PartitionFence.acquire` is the lease itself: another run's unexpired lease blocks it, a
  newer try of the same run takes over.

Every overwrite locks the row (``SELECT ... FOR UPDATE`` on PostgreSQL; ``BEGIN IMMEDIATE`` on
SQLite) and refuses unless the attempt holds the newest token (:meth:`PartitionFence.check`), so
a writer of one mode is refused after a newer attempt of the other, and a zombie is refused even
before the newer attempt commits. No clock is trusted for that: expiry only decides when a
warehouse lease may be taken over, and it is the **warehouse database's clock**, read in the
same transaction (PostgreSQL ``clock_timestamp()``; SQLite ``'now'``, the clock of the host that
reads the file), as the work ledger's leases use the ledger database's: a worker whose clock
runs behind would otherwise write leases that others already see expired.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.sales.partitions import partition_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Connection

_EPOCH = dt.datetime(1970, 1, 1)


class StaleAttemptError(RuntimeError):
    """This attempt no longer holds the partition's newest fence token; its write is refused."""


class OlderExtractError(StaleAttemptError):
    """The attempt's extract read the shop before the extract of the committed load did."""


class PartitionLeaseHeld(RuntimeError):
    """Another run holds an unexpired lease on the partition; try again later."""


@dataclasses.dataclass(frozen=True)
class Lease:
    """What an attempt holds: the partition's fence token it must still hold at commit."""

    table: str
    partition: dt.date
    fence_token: int
    run_id: str
    try_number: int
    expires_at_utc: dt.datetime
    #: ``warehouse``: a lease of ``load_fence`` itself; ``ledger``: the work ledger's lease.
    fenced_by: str = "warehouse"
    work_key: str = ""
    #: the work ledger's token (ledger mode only).
    ledger_token: int | None = None

    def describe(self) -> str:
        """The lease in words, for messages and logs."""
        ledger = f", ledger token {self.ledger_token}" if self.ledger_token is not None else ""
        return f"run {self.run_id!r} try {self.try_number} holds fence token {self.fence_token}{ledger}"


def _holder(row: Any) -> str:
    ledger = f", ledger token {row.ledger_token}" if row.fenced_by == "ledger" else ""
    return f"{row.fence_token} (run {row.run_id!r} try {row.try_number}{ledger})"


class PartitionFence:
    """The ``load_fence`` rows of one sales table.

    :param table_name: the validated sales table name.
    :param fence: the ``load_fence`` table.
    :param dialect: ``postgresql`` or ``sqlite``.
    :param clock: naive-UTC clock for lease expiry and ``updated_at``; None (the default of
        :class:`~onceflow.sales.partition_store.PartitionStore`): the database's, see :meth:`now`.
    """

    def __init__(
        self, table_name: str, fence: sa.Table, dialect: str, clock: Callable[[], dt.datetime] | None = None
    ) -> None:
        if dialect not in ("postgresql", "sqlite"):
            raise NotImplementedError(f"partition loads support postgresql and sqlite, not {dialect}")
        self.table_name = table_name
        self.fence = fence
        self.dialect = dialect
        self.clock = clock

    def now(self, conn: Connection) -> dt.datetime:
        """Naive UTC now: the injected clock (tests), else the database's, read on ``conn``.

        On the transaction's own connection, so a pool of one connection does not wait for itself.
        """
        if self.clock is not None:
            return self.clock()
        if self.dialect == "postgresql":
            return conn.execute(
                sa.text("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::timestamp")
            ).scalar_one()
        value = conn.execute(sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
        return dt.datetime.fromisoformat(value)

    def _where(self, key: str) -> Any:
        ft = self.fence
        return sa.and_(ft.c.table_name == self.table_name, ft.c.partition_key == key)

    def lock(self, conn: Connection, key: str) -> Any:
        """The partition's fence row, locked to the end of the transaction, or None."""
        stmt = sa.select(self.fence).where(self._where(key))
        if self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).one_or_none()

    def _lock_or_create(self, conn: Connection, key: str, work_key: str, now: dt.datetime) -> Any:
        """The partition's fence row, created (tokens 0) if missing, locked; ``now``: the caller's
        read of the clock in this transaction (one round trip fewer than reading it again)."""
        values = {
            "table_name": self.table_name, "partition_key": key, "work_key": work_key, "fence_token": 0,
            "committed_token": 0, "run_id": "", "try_number": 0, "updated_at_utc": now,
            "ledger_token": 0, "fenced_by": "warehouse", "expires_at_utc": _EPOCH,
        }  # fmt: skip
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            conn.execute(pg_insert(self.fence).values(**values).on_conflict_do_nothing())
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            conn.execute(sqlite_insert(self.fence).values(**values).on_conflict_do_nothing())
        return self.lock(conn, key)

    def acquire(
        self, conn: Connection, partition: dt.date, *, run_id: str, try_number: int, lease_seconds: int
    ) -> Lease:
        """Warehouse mode: take the partition's next token and a lease that expires.

        :raises PartitionLeaseHeld: another run holds an unexpired warehouse lease.
        :raises StaleAttemptError: a newer try of the same run already took the partition.
        """
        key = partition_key(partition)
        now = self.now(conn)
        row = self._lock_or_create(conn, key, "", now)
        if row.run_id == run_id and row.try_number > try_number:
            raise StaleAttemptError(
                f"{self.table_name} partition {key}: try {try_number} of run {run_id!r} is stale, "
                f"try {row.try_number} already took the partition (fence token {row.fence_token})"
            )
        if row.fenced_by == "warehouse" and row.run_id not in ("", run_id) and row.expires_at_utc > now:
            raise PartitionLeaseHeld(
                f"{self.table_name} partition {key} is leased to run {row.run_id!r} try {row.try_number} "
                f"until {row.expires_at_utc.isoformat()}Z; retry after it commits or expires"
            )
        token = max(int(row.fence_token), int(row.committed_token)) + 1
        expires = now + dt.timedelta(seconds=lease_seconds)
        conn.execute(
            self.fence.update()
            .where(self._where(key))
            .values(fence_token=token, run_id=run_id, try_number=try_number, fenced_by="warehouse",
                    expires_at_utc=expires, updated_at_utc=now)
        )  # fmt: skip
        return Lease(self.table_name, partition, token, run_id, try_number, expires)

    def register_ledger(
        self, conn: Connection, partition: dt.date, *, token: int, work_key: str, run_id: str, try_number: int
    ) -> Lease:
        """Ledger mode: record the ledger's token and take the partition's next fence token.

        :raises StaleAttemptError: a newer ledger token is registered already.
        :raises PartitionLeaseHeld: another run holds an unexpired warehouse-mode lease.
        """
        key = partition_key(partition)
        now = self.now(conn)
        row = self._lock_or_create(conn, key, work_key, now)
        if int(row.ledger_token) > token:
            raise StaleAttemptError(
                f"{self.table_name} partition {key}: ledger token {token} of run {run_id!r} try "
                f"{try_number} is stale, ledger token {row.ledger_token} already took the partition "
                f"(fence token {_holder(row)})"
            )
        if row.fenced_by == "warehouse" and row.run_id not in ("", run_id) and row.expires_at_utc > now:
            raise PartitionLeaseHeld(
                f"{self.table_name} partition {key} is leased in warehouse mode to run {row.run_id!r} "
                f"try {row.try_number} until {row.expires_at_utc.isoformat()}Z"
            )
        fence_token = max(int(row.fence_token), int(row.committed_token)) + 1
        conn.execute(
            self.fence.update()
            .where(self._where(key))
            .values(fence_token=fence_token, ledger_token=token, work_key=work_key, run_id=run_id,
                    try_number=try_number, fenced_by="ledger", expires_at_utc=now, updated_at_utc=now)
        )  # fmt: skip
        return Lease(
            self.table_name, partition, fence_token, run_id, try_number, now, "ledger", work_key, token
        )

    def check(self, conn: Connection, lease: Lease) -> Any:
        """Lock the row and raise :class:`StaleAttemptError` unless ``lease`` holds the newest token."""
        key = partition_key(lease.partition)
        row = self.lock(conn, key)
        if row is None or int(row.fence_token) != lease.fence_token or row.run_id != lease.run_id:
            newest = "none" if row is None else _holder(row)
            raise StaleAttemptError(
                f"refusing to overwrite {self.table_name} partition {key}: {lease.describe()}, "
                f"the newest is {newest}"
            )
        return row

    def mark_committed(self, conn: Connection, lease: Lease, now: dt.datetime) -> None:
        """Record the commit; a warehouse lease ends so another run may load at once.

        :param now: this transaction's read of the clock (:meth:`now`; the audit's ``loaded_at_utc``).
        """
        conn.execute(
            self.fence.update()
            .where(self._where(partition_key(lease.partition)))
            .values(committed_token=lease.fence_token, expires_at_utc=now, updated_at_utc=now)
        )

    def release(self, conn: Connection, lease: Lease) -> None:
        """End a warehouse lease without a commit; the token stays, so older attempts stay fenced."""
        if lease.fenced_by == "warehouse":
            conn.execute(
                self.fence.update()
                .where(self._where(partition_key(lease.partition)))
                .values(expires_at_utc=self.now(conn))
            )
