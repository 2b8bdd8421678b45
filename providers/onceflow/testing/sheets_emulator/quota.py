"""Google's per-user request quotas (by default 60 reads and 60 writes per minute), as a sliding window.

Off unless configured. A request over the limit gets 429 with ``Retry-After`` set to the seconds
until the oldest counted request leaves the window. Rejected requests do not use up quota, so a
client that backs off as told gets through.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable


class Quota:
    """Per-minute read and write limits over a sliding window.

    :param reads_per_minute: admitted read requests per window; ``None`` for no limit.
    :param writes_per_minute: admitted write requests per window; ``None`` for no limit.
    :param window: window length in seconds (60 as at Google; shorter in tests).
    :param clock: monotonic clock in seconds.
    """

    def __init__(
        self,
        reads_per_minute: int | None = 60,
        writes_per_minute: int | None = 60,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.limits = {False: reads_per_minute, True: writes_per_minute}
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._admitted: dict[bool, deque[float]] = {False: deque(), True: deque()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Quota:
        known = {"reads_per_minute", "writes_per_minute", "window"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown quota fields {sorted(unknown)}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {
            "reads_per_minute": self.limits[False],
            "writes_per_minute": self.limits[True],
            "window": self.window,
        }

    def admit(self, writes: bool) -> float | None:
        """Count one request; return ``None`` when admitted, else the seconds to wait.

        :param writes: whether the request counts against the write quota.
        """
        limit = self.limits[writes]
        if limit is None:
            return None
        with self._lock:
            now = self._clock()
            admitted = self._admitted[writes]
            while admitted and admitted[0] <= now - self.window:
                admitted.popleft()
            if len(admitted) < limit:
                admitted.append(now)
                return None
            return max(0.0, admitted[0] + self.window - now)

    @staticmethod
    def header(wait: float) -> str:
        return str(max(1, math.ceil(wait)))
