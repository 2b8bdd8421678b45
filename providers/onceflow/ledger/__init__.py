"""The work ledger: work items, leases with fencing tokens, fenced result commits, an explicit
state model, an outbox, reconciliation and rechecks, on PostgreSQL or SQLite.

No Airflow imports here: the Airflow side lives in ``onceflow.hooks.ledger`` and
``onceflow.operators.ledger``. See ``docs/ledger.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.ledger.clock import Clock, SystemClock
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.db import create_ledger_engine
    from onceflow.ledger.errors import (
        IllegalTransition,
        LeaseHeld,
        LedgerError,
        StaleFenceError,
        UnknownWorkItem,
        WrongVersion,
    )
    from onceflow.ledger.models import FollowUp, Lease, ResultRecord, TransitionRecord, WorkItem

# Loaded on first use (PEP 562): importing one submodule, say ``onceflow.ledger.db`` for its engine
# rules in a task that never opens the ledger, must not import the whole ledger with it.
_HOMES = {
    "Clock": "clock",
    "SystemClock": "clock",
    "Ledger": "core",
    "create_ledger_engine": "db",
    "IllegalTransition": "errors",
    "LeaseHeld": "errors",
    "LedgerError": "errors",
    "StaleFenceError": "errors",
    "UnknownWorkItem": "errors",
    "WrongVersion": "errors",
    "FollowUp": "models",
    "Lease": "models",
    "ResultRecord": "models",
    "TransitionRecord": "models",
    "WorkItem": "models",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Clock",
    "FollowUp",
    "IllegalTransition",
    "Lease",
    "LeaseHeld",
    "Ledger",
    "LedgerError",
    "ResultRecord",
    "StaleFenceError",
    "SystemClock",
    "TransitionRecord",
    "UnknownWorkItem",
    "WorkItem",
    "WrongVersion",
    "create_ledger_engine",
]
