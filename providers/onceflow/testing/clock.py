"""A fake clock for the ledger and for users' own tests: time moves only when told to.

::

    clock = FakeClock(start=1_000_000.0)
    ledger = Ledger(engine, clock=clock)
    lease = ledger.claim("fetch", "w1", lease_seconds=30, worker_version="v1")
    clock.advance(31)            # the lease is now expired, without sleeping
"""

from __future__ import annotations

import threading

DEFAULT_START = 1_800_000_000.0  # 2027-01-15, a fixed, recognisable instant


class FakeClock:
    """Implements ``onceflow.ledger.clock.Clock``; thread-safe.

    :param start: initial time, float seconds since the epoch.
    """

    def __init__(self, start: float = DEFAULT_START) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (never backwards) and return the new time."""
        if seconds < 0:
            raise ValueError("a clock does not run backwards")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        """Jump to ``when`` (must not be earlier than now)."""
        with self._lock:
            if when < self._now:
                raise ValueError("a clock does not run backwards")
            self._now = float(when)
