"""Whose clock decides: the database's, unless a test injects a clock.

Every lease decision (is this item available, has this lease expired, when does the new lease
end) compares times written by different processes, often on different machines. A worker whose
clock runs a minute ahead would take over fresh leases; one running behind would write leases that
are already expired. So the lease statements (claim, heartbeat, release, expire) read the
database server's clock *in the same statement* (PostgreSQL ``clock_timestamp()``, SQLite
``julianday('now')``) through ``COALESCE(:now, <database clock>)``: ``:now`` is ``NULL`` unless a
test injected a clock (``onceflow.testing.clock.FakeClock``), which then decides instead.

Times that are only recorded or compared later (audit ``at``, a retry's ``available_at``, a new
item's ``available_at``) come from :class:`DatabaseClock` as well: one small read of the same
clock before the write. Times are float seconds since the Unix epoch (UTC) on both databases.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Protocol

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

# The database clocks as epoch seconds. SQLite 3.40 has no unixepoch('subsec'); julianday('now')
# has millisecond resolution and, like the PostgreSQL expression, is one value per statement.
POSTGRESQL_NOW = "extract(epoch FROM clock_timestamp())::double precision"
SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class Clock(Protocol):
    """Anything with ``now() -> float`` (seconds since the epoch)."""

    def now(self) -> float:
        """Seconds since the epoch, as the ledger's decisions see them."""


class SystemClock:
    """This machine's clock. Only for a ledger that one process uses alone: between processes,
    a skewed clock decides leases wrongly (the default :class:`DatabaseClock` does not)."""

    def now(self) -> float:
        """This host's clock."""
        return time.time()


class DatabaseClock:
    """The ledger database's clock, the default of :class:`~onceflow.ledger.Ledger`.

    PostgreSQL: ``clock_timestamp()`` of the server, read on a connection of its own (so it can
    be asked while a ledger transaction is open), every time. Not extrapolated locally: a time
    read this way is never later than what a statement run afterwards reads, so an item added
    "now" is claimable by the next claim (a locally carried-forward estimate can run a few
    milliseconds ahead of the server and make it wait). SQLite is embedded: its clock is the
    clock of the host the file lives on, read the way SQLite reads it (an in-memory database,
    so the ledger file's write lock is never touched).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sqlite: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        if engine.dialect.name == "sqlite":
            self._sqlite = sqlite3.connect(":memory:", check_same_thread=False)

    def now(self) -> float:
        """The database server's clock, so every worker judges leases on one time line."""
        if self._sqlite is not None:
            with self._lock:
                return float(self._sqlite.execute(f"SELECT {SQLITE_NOW}").fetchone()[0])
        with self.engine.connect() as conn:
            return float(conn.execute(sa.text(f"SELECT {POSTGRESQL_NOW}")).scalar_one())


def statement_now(clock: Clock) -> float | None:
    """The ``:now`` a lease statement gets: ``None`` (it reads the database clock) by default."""
    return None if isinstance(clock, DatabaseClock) else clock.now()


def db_now(conn: Connection, now: float | None) -> float:
    """``now`` if a clock was injected, else the database clock, read on ``conn`` (in its transaction)."""
    if now is not None:
        return now
    expression = SQLITE_NOW if conn.dialect.name == "sqlite" else POSTGRESQL_NOW
    return float(conn.execute(sa.text(f"SELECT {expression}")).scalar_one())
