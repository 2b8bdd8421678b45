"""Deadlines on every statement of the shop and the warehouse.

No wait without a deadline: a lock another session never releases, or a statement that never
returns, must fail the try (which releases its ledger lease, see :mod:`onceflow.sales.ledger_link`)
rather than keep the partition's lease alive by heartbeats forever. Every PostgreSQL session these
engines open sets

* ``lock_timeout`` (``$ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS``, default 120 s): the longest any one
  statement waits for a lock (the fence row, the sales table held by a long report or a
  ``LOCK TABLE``);
* ``statement_timeout`` (``$ONCEFLOW_SALES_STATEMENT_TIMEOUT_SECONDS``, default 3600 s): the longest
  any one statement runs (the shop's read, a day's ``COPY``).

A statement cancelled by either raises :class:`DeadlineExceeded` naming the setting, its value,
the statement and what to do; the try fails and Airflow retries it. SQLite has no statement
timeout; its lock wait is bounded by the busy timeout (60 s). Each task also has an
``execution_timeout`` (``$ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES``, see :mod:`onceflow.sales.config`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

LOCK_TIMEOUT_ENV = "ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS"
STATEMENT_TIMEOUT_ENV = "ONCEFLOW_SALES_STATEMENT_TIMEOUT_SECONDS"
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"


class DeadlineExceeded(RuntimeError):
    """A shop or warehouse statement waited or ran past its deadline; the try fails and is retried.

    The message says what happened to the partition's lease only where that is known: the load
    through the work ledger (:mod:`onceflow.sales.ledger_link`) and the load without it (the
    operator) each add it with :meth:`noting`; the statement's own message makes no claim.
    """

    def noting(self, note: str) -> DeadlineExceeded:
        """The same error with ``note`` appended to its message."""
        return DeadlineExceeded(f"{self} {note}")


@dataclasses.dataclass(frozen=True)
class Deadlines:
    """Per-statement deadlines of one engine, in seconds."""

    lock_timeout_s: float = 120.0
    statement_timeout_s: float = 3600.0

    @classmethod
    def from_env(cls) -> Deadlines:
        """Read the time limits from the environment (defaults for the unset ones); a value that is not a number of seconds is refused with its name."""

        def seconds(name: str, default: float) -> float:
            raw = os.environ.get(name, "").strip()
            try:
                value = float(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
            if not value > 0 or not math.isfinite(value):  # "nan" and "inf" parse as floats
                raise ValueError(f"{name} must be positive (a wait needs a deadline), got {raw!r}")
            if _milliseconds(value) > _MAX_MILLISECONDS:
                raise ValueError(
                    f"{name} must be at most {_MAX_MILLISECONDS / 1000:g} seconds (PostgreSQL's limit), got {raw!r}"
                )
            return value

        return cls(
            seconds(LOCK_TIMEOUT_ENV, cls.lock_timeout_s),
            seconds(STATEMENT_TIMEOUT_ENV, cls.statement_timeout_s),
        )


def install(engine: Engine, what: str, deadlines: Deadlines | None = None) -> Engine:
    """Set the deadlines on each new PostgreSQL session of ``engine``; name them in its errors.

    :param what: ``"warehouse"`` or ``"shop"``: how the error names the database.
    """
    if engine.dialect.name != "postgresql":
        return engine
    from sqlalchemy import event

    limits = deadlines or Deadlines.from_env()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True  # session settings, outside any transaction
        cursor = dbapi_connection.cursor()
        # One round trip for both, in ONE statement: two SETs joined by ';' are refused where the
        # query is prepared (psycopg 3 with prepare_threshold=0: "cannot insert multiple commands
        # into a prepared statement"); set_config(..., false) is SET, for the session.
        cursor.execute(
            f"SELECT set_config('lock_timeout', '{_milliseconds(limits.lock_timeout_s)}ms', false), "
            f"set_config('statement_timeout', '{_milliseconds(limits.statement_timeout_s)}ms', false)"
        )
        cursor.close()
        dbapi_connection.autocommit = autocommit
        record.info[_INFO_KEY] = (what, limits)

    @event.listens_for(engine, "handle_error")
    def _name_the_deadline(context: Any) -> BaseException | None:
        return describe(context.original_exception, what, limits, context.statement)

    return engine


_INFO_KEY = "onceflow.deadlines"
#: PostgreSQL's largest ``lock_timeout`` and ``statement_timeout`` (about 24.8 days).
_MAX_MILLISECONDS = 2**31 - 1


def _milliseconds(seconds: float) -> int:
    """``seconds`` in the whole milliseconds PostgreSQL sets, rounded up: never 0, which PostgreSQL
    reads as no timeout at all (0.0004 s was set as ``'0ms'``)."""
    return max(1, math.ceil(seconds * 1000))


def translate(conn: Any, exc: BaseException, statement: str) -> DeadlineExceeded | None:
    """:func:`describe` for a statement run on the raw DBAPI cursor of ``conn`` (e.g. ``COPY``)."""
    found = conn.connection.info.get(_INFO_KEY)
    return None if found is None else describe(exc, found[0], found[1], statement)


def describe(
    exc: BaseException, what: str, limits: Deadlines, statement: str | None
) -> DeadlineExceeded | None:
    """The :class:`DeadlineExceeded` for a DBAPI error cancelled by a deadline, else None."""
    code = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)
    text = " ".join((statement or "").split())[:120]
    if code == _LOCK_NOT_AVAILABLE:
        return DeadlineExceeded(
            f"the {what} statement waited more than lock_timeout={limits.lock_timeout_s:g}s for a lock "
            f"another session holds ({text!r}); this try fails and Airflow retries it, and a try loads "
            f"once the lock is gone. Find the holder in pg_locks/pg_stat_activity; {LOCK_TIMEOUT_ENV} "
            "sets the wait."
        )
    if code == _QUERY_CANCELED and "statement timeout" in str(exc):
        return DeadlineExceeded(
            f"the {what} statement ran longer than statement_timeout={limits.statement_timeout_s:g}s "
            f"({text!r}); this try fails and is retried. {STATEMENT_TIMEOUT_ENV} sets the limit."
        )
    return None
