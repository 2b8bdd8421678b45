"""Backoff for quota errors: exponential with full jitter, never shorter than ``Retry-After``.

Full jitter (sleep a uniform time in ``[0, cap]``) spreads concurrent claimers that were refused
together, so they do not come back together; ``Retry-After`` is a floor because the server knows
better than we do when quota refills.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class RetryableError(Exception):
    """Raised by a transport when a request was refused before it was applied (429, or 5xx on reads).

    :param retry_after: seconds the server asked us to wait, if it said.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QuotaExceeded(RetryableError):
    """HTTP 429: the request was refused and not applied; safe to repeat after a pause."""


class Refused(Exception):
    """HTTP 400: the request was refused as invalid, and (every request being atomic) none of it
    was applied. A claim batch gets this when rows were deleted under it, so that a row it aimed
    at is past the end of the sheet (an anchor cannot be created there)."""


class ServerError(Exception):
    """HTTP 5xx or a broken connection: a write may or may not have been applied.

    :param retry_after: seconds the server asked us to wait, if it said.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Backoff:
    """Retry policy.

    :param attempts: total tries, including the first.
    :param base: first backoff cap in seconds; doubles each retry up to ``cap``.
    :param cap: largest backoff cap in seconds.
    :param max_retry_after: never wait longer than this even if the server says so.
    """

    attempts: int = 8
    base: float = 0.2
    cap: float = 32.0
    max_retry_after: float = 120.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        jitter = self.rng.uniform(0, min(self.cap, self.base * (2**retry)))
        floor = min(retry_after, self.max_retry_after) if retry_after else 0.0
        return max(floor, jitter)

    def call(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` until it does not raise :class:`RetryableError`, or attempts run out."""
        for retry in range(self.attempts):
            try:
                return fn()
            except RetryableError as err:
                if retry == self.attempts - 1:
                    raise
                self.sleep(self.delay(retry, err.retry_after))
        raise AssertionError("unreachable")
