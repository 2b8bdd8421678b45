"""The work ledger: work items, leases with fencing tokens, fenced result commits, an explicit
state model, an outbox, reconciliation and rechecks, on PostgreSQL or SQLite.

No Airflow imports here: the Airflow side lives in ``onceflow.hooks.ledger`` and
``onceflow.operators.ledger``. See ``docs/ledger.md``.
"""

from __future__ import annotations

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
