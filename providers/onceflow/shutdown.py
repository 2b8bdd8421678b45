"""A stop flag that signals set, for loops that must finish their clean-up whatever arrives.

The handler only records the request; it never raises. A handler that raised (``KeyboardInterrupt``)
would do so again for a second signal, and a second signal is the normal case: ``make`` forwards
the SIGTERM its process group already received, and people press Ctrl-C twice. Raised inside a
``finally``, it would abandon the clean-up there.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any


class GracefulShutdown:
    """A stop flag that signals set; install it for the duration of the work."""

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, *_: Any) -> None:
        self._event.set()

    @contextlib.contextmanager
    def installed(self, signals: Sequence[int] = (signal.SIGTERM,)) -> Iterator[GracefulShutdown]:
        """Route ``signals`` to :meth:`request` (main thread only), restoring the old handlers."""
        previous = {sig: signal.signal(sig, self.request) for sig in signals}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
