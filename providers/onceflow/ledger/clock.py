"""Time source of the ledger, injectable so tests can move time without sleeping.

The ledger stores every time as float seconds since the Unix epoch (UTC): the same column type
and comparison on PostgreSQL and SQLite, and no time-zone surprises.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now() -> float`` (seconds since the epoch)."""

    def now(self) -> float: ...


class SystemClock:
    """Wall-clock time of this machine."""

    def now(self) -> float:
        return time.time()
