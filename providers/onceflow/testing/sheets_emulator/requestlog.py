"""Counts of API calls per method, for call-budget tests and benchmarks.

Every request that reaches an API method is counted, including those answered with an injected
fault (Google's quota counts those too). Reads and writes are totalled the way Google's per-minute
quotas split them. The ``timeline`` keeps each request's arrival time, status and ``Retry-After``
(the last :data:`TIMELINE_LENGTH`), so tests can check how long a client waited after a 429.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

TIMELINE_LENGTH = 100_000


@dataclass(frozen=True)
class RequestEvent:
    """One request answered.

    :param at: ``time.monotonic()`` when it arrived.
    :param method: the API method (``values.batchGet``).
    :param status: the HTTP status answered.
    :param retry_after: the ``Retry-After`` header sent, if any.
    """

    at: float
    method: str
    status: int
    retry_after: str | None = None


class RequestLog:
    """Thread-safe per-method counters, and the timeline of requests answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._faults: Counter[str] = Counter()
        self._reads = 0
        self._writes = 0
        self._timeline: deque[RequestEvent] = deque(maxlen=TIMELINE_LENGTH)

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

    def record_reply(self, event: RequestEvent) -> None:
        with self._lock:
            self._timeline.append(event)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._faults.clear()
            self._timeline.clear()
            self._reads = self._writes = 0

    @property
    def timeline(self) -> list[RequestEvent]:
        """Requests answered, in arrival order: ``at`` (monotonic seconds), ``method``, ``status``,
        ``retry_after``."""
        with self._lock:
            return sorted(self._timeline, key=lambda e: e.at)

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
