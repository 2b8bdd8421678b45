"""A stop flag that signals set, for loops that must finish their clean-up whatever arrives.

The handler only records the request; it never raises. A handler that raised (``KeyboardInterrupt``)
would do so again for a second signal, and a second signal is the normal case: ``make`` forwards
the SIGTERM its process group already received, and people press Ctrl-C twice. Raised inside a
``finally``, it would abandon the clean-up there.

Work that holds something another process is waiting for (a ledger lease) registers a callback
with :meth:`GracefulShutdown.on_request`: it runs once, at the request, so the lease goes back at
once rather than when the process ends. An Airflow task's ``on_kill`` (which Airflow calls from
its SIGTERM handler) calls :meth:`GracefulShutdown.request` the same way.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class GracefulShutdown:
    """A stop flag that signals set; install it for the duration of the work."""

    def __init__(self) -> None:
        self._event = threading.Event()
        # No lock: request() runs in a signal handler on the main thread, which may be the thread
        # inside on_request(); dict pop is atomic, so each callback runs once.
        self._callbacks: dict[object, Callable[[], None]] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, *_: Any) -> None:
        """Set the flag and run each registered callback once (signal-handler safe if they are)."""
        self._event.set()
        for key in list(self._callbacks):
            callback = self._callbacks.pop(key, None)
            if callback is not None:
                callback()

    @contextlib.contextmanager
    def on_request(self, callback: Callable[[], None]) -> Iterator[None]:
        """Run ``callback`` once if shutdown is requested while the block runs (at once if it was).

        The callback may run inside a signal handler: it must not take locks the interrupted code
        may hold (hand slow work to a thread, as :func:`onceflow.ledger.steps.hand_back_on_shutdown`
        does).
        """
        key = object()
        self._callbacks[key] = callback
        try:
            if self.requested and self._callbacks.pop(key, None) is not None:
                callback()
            yield
        finally:
            self._callbacks.pop(key, None)

    @contextlib.contextmanager
    def installed(self, signals: Sequence[int] = (signal.SIGTERM,)) -> Iterator[GracefulShutdown]:
        """Route ``signals`` to :meth:`request` (main thread only), restoring the old handlers."""
        previous = {sig: signal.signal(sig, self.request) for sig in signals}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
