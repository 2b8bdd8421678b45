"""Backoff for quota errors: exponential with full jitter, on top of ``Retry-After``.

Full jitter (a uniform time in ``[0, cap]``) spreads concurrent claimers that were refused
together, so they do not come back together; ``Retry-After`` is a floor because the server knows
better than we do when quota refills, and the jitter is added on top of it (claimers told the same
``Retry-After`` would otherwise all come back in the same instant). When the attempts run out,
:class:`RetriesExhausted` (:class:`QuotaExhausted` for 429s) says so, with the attempts made, the
time spent waiting and the last refusal (which names the method and the HTTP status).
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


class RetriesExhausted(RetryableError):
    """:meth:`Backoff.call` gave up: every attempt was refused (for 429s: none was applied). An
    outer :class:`Backoff` does not retry it (that would multiply the budget).

    :param last: the last refusal; the transport's message starts with the method and the HTTP
        status (``spreadsheets.batchUpdate: 429 ...``).
    :param attempts: tries made, including the first.
    :param waited: seconds slept between them.
    """

    def __init__(self, last: RetryableError, attempts: int, waited: float) -> None:
        after = "none" if last.retry_after is None else f"{last.retry_after:g} s"
        super().__init__(
            f"gave up after {attempts} attempts, all refused ({waited:.1f} s of backoff, last "
            f"Retry-After {after}): {last}",
            last.retry_after,
        )
        self.last = last
        self.attempts = attempts
        self.waited = waited


class QuotaExhausted(RetriesExhausted, QuotaExceeded):
    """HTTP 429 on every attempt: the quota did not refill within the retry budget."""


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
        """Seconds to wait before retry number ``retry`` (0-based): ``Retry-After`` (capped at
        ``max_retry_after``; 0 when the server did not say) plus a uniform jitter in
        ``[0, min(cap, base * 2**retry)]``."""
        jitter = self.rng.uniform(0, min(self.cap, self.base * (2**retry)))
        floor = min(retry_after, self.max_retry_after) if retry_after else 0.0
        return floor + jitter

    def call(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` until it does not raise :class:`RetryableError`, or attempts run out.

        :raises QuotaExhausted: the last attempt was refused with 429 (a :class:`QuotaExceeded`).
        :raises RetriesExhausted: the last attempt was refused otherwise.
        """
        waited = 0.0
        for retry in range(self.attempts):
            try:
                return fn()
            except RetriesExhausted:
                raise
            except RetryableError as err:
                if retry == self.attempts - 1:
                    kind = QuotaExhausted if isinstance(err, QuotaExceeded) else RetriesExhausted
                    raise kind(err, self.attempts, waited) from err
                pause = self.delay(retry, err.retry_after)
                self.sleep(pause)
                waited += pause
        raise AssertionError("unreachable")
