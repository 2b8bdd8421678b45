"""Where the operations view reads from, and its settings.

The view only reads. It opens its own engines on the URLs the hooks resolve (connections
``onceflow_ledger`` and ``onceflow_warehouse``, with the same embedded SQLite defaults), not the
hooks' engines: on SQLite the ledger's engine starts every transaction with ``BEGIN IMMEDIATE``
(the write lock), which a page view must never take. Every statement has a time limit
(:data:`STATEMENT_TIMEOUT_MS`), so a locked or slow database gives an error on the page instead
of a hung request.

Settings come from Airflow's configuration (``[onceflow_ops]`` in ``airflow.cfg`` or
``AIRFLOW__ONCEFLOW_OPS__*``), read when a request needs them; see ``docs/operations-view.md``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

STATEMENT_TIMEOUT_MS = 5_000
SECTION = "onceflow_ops"

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Settings:
    """``[onceflow_ops]``.

    :param tables: the warehouse tables whose partitions the calendar shows.
    :param calendar_days: how many days the calendar shows, up to the day due today.
    :param watchdog_status_url: the watchdog's loopback status endpoint; empty reads its tables.
    :param metrics_token: a bearer token that may read ``/metrics`` without an Airflow user.
    """

    tables: tuple[str, ...] = ("daily_sales",)
    calendar_days: int = 60
    watchdog_status_url: str = ""
    metrics_token: str = ""

    @classmethod
    def from_airflow(cls) -> Settings:
        """Read the settings from Airflow's configuration."""
        from airflow.configuration import conf

        def get(key: str, default: str) -> str:
            return str(conf.get(SECTION, key, fallback=default) or default).strip()

        tables = tuple(t.strip() for t in get("tables", ",".join(cls.tables)).split(",") if t.strip())
        days = int(get("calendar_days", str(cls.calendar_days)))
        if not 1 <= days <= 3660:
            raise ValueError(f"[{SECTION}] calendar_days must be between 1 and 3660, not {days}")
        return cls(
            tables=tables,
            calendar_days=days,
            watchdog_status_url=get("watchdog_status_url", ""),
            metrics_token=get("metrics_token", ""),
        )


def read_engine(url: str) -> Engine:
    """A read-only-use engine for ``url``, one per URL per process."""
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = create_read_engine(url)
            _engines[url] = engine
        return engine


def create_read_engine(url: str, *, application_name: str = "onceflow-read") -> Engine:
    """An engine for reading ``url``: no SQLite write lock (unlike the ledger's own engines), and a
    time limit on every statement (:data:`STATEMENT_TIMEOUT_MS`); on PostgreSQL the same limit on
    connecting and on an open connection whose peer is gone (``connect_timeout``, TCP keepalives,
    ``tcp_user_timeout``: :func:`onceflow.ledger.db.postgres_socket_deadlines`), so a black-holed
    database is an error within seconds, not a hang of minutes. ``onceflow.run_notes`` reads the
    ledger through one too.

    :param application_name: how the connections show in PostgreSQL's ``pg_stat_activity``.
    """
    from onceflow.ledger.db import postgres_socket_deadlines

    parsed = sa.engine.make_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {
            **postgres_socket_deadlines(STATEMENT_TIMEOUT_MS / 1000),
            "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            "application_name": application_name,
        }
    elif parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": STATEMENT_TIMEOUT_MS / 1000, "check_same_thread": False}
    return sa.create_engine(url, **kwargs)


def ledger_engine() -> Engine:
    """A read-only engine on the ledger (``onceflow_ledger``)."""
    from onceflow.hooks.ledger import LedgerHook

    return read_engine(LedgerHook().get_url())


def warehouse_engine() -> Engine:
    """A read-only engine on the warehouse (``onceflow_warehouse``)."""
    from onceflow.hooks.warehouse import WarehouseHook

    return read_engine(WarehouseHook().get_url())


def reset() -> None:
    """Dispose of the engines (tests that point the connections elsewhere)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
