"""Counts of API calls per method, for call-budget tests and benchmarks.

Every request that reaches an API method is counted, including those answered with an injected
fault (Google's quota counts those too). Reads and writes are totalled the way Google's per-minute
quotas split them.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class RequestLog:
    """Thread-safe per-method counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._faults: Counter[str] = Counter()
        self._reads = 0
        self._writes = 0

    def record(self, method: str, *, writes: bool) -> None:
        with self._lock:
            self._counts[method] += 1
            if writes:
                self._writes += 1
            else:
                self._reads += 1

    def record_fault(self, kind: str) -> None:
        with self._lock:
            self._faults[kind] += 1

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._faults.clear()
            self._reads = self._writes = 0

    @property
    def counts(self) -> dict[str, int]:
        """Requests received per method, e.g. ``{"values.get": 2}``."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return self._reads + self._writes

    @property
    def reads(self) -> int:
        with self._lock:
            return self._reads

    @property
    def writes(self) -> int:
        with self._lock:
            return self._writes

    def __getitem__(self, method: str) -> int:
        with self._lock:
            return self._counts[method]

    def snapshot(self) -> dict[str, Any]:
        """``{"counts": {method: n}, "total", "reads", "writes", "faults": {kind: n}}``."""
        with self._lock:
            return {
                "counts": dict(self._counts),
                "total": self._reads + self._writes,
                "reads": self._reads,
                "writes": self._writes,
                "faults": dict(self._faults),
            }
