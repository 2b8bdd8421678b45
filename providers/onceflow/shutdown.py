"""A stop flag that signals set, for loops that must finish their clean-up whatever arrives.

The handler only records the request; it never raises. A handler that raised (``KeyboardInterrupt``)
would do so again for a second signal, and a second signal is the normal case: ``make`` forwards
the SIGTERM its process group already received, and people press Ctrl-C twice. Raised inside a
``finally``, it would abandon the clean-up there.

Work that holds something another process is waiting for (a ledger lease) registers a callback
with :meth:`GracefulShutdown.on_request`: it runs once, at the request, so the lease goes back at
once rather than when the process ends. An Airflow task's ``on_kill`` (which Airflow calls from
its SIGTERM handler) calls :meth:`GracefulShutdown.request` the same way.

Python runs a signal handler only when the main thread is back in the interpreter: a main thread
blocked in C code (a database driver waiting for a lock, a long ``COPY``) sees SIGTERM only when
that call returns, and Airflow's SIGKILL comes 5 s after its SIGTERM. :meth:`GracefulShutdown.watching`
closes that gap with the signal module's wakeup fd, which the C part of the handler writes at once.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class GracefulShutdown:
    """A stop flag that signals set; install it for the duration of the work."""

    def __init__(self) -> None:
        # A plain attribute, not a threading.Event: request() runs in signal handlers, and a signal
        # landing while the main thread is inside Event.set() (which holds a plain lock) would
        # make the nested handler wait for that lock forever.
        self._requested = False
        # No lock: request() runs in a signal handler on the main thread, which may be the thread
        # inside on_request(); dict pop is atomic, so each callback runs once.
        self._callbacks: dict[object, Callable[[], None]] = {}

    @property
    def requested(self) -> bool:
        """Whether SIGTERM or SIGINT arrived."""
        return self._requested

    def request(self, *_: Any) -> None:
        """Set the flag and run each registered callback once (signal-handler safe if they are)."""
        self._requested = True
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
    def watching(self, signals: Sequence[int] = (signal.SIGTERM,)) -> Iterator[GracefulShutdown]:
        """Request shutdown the moment one of ``signals`` arrives, even while the main thread is
        blocked in C code; Python handlers run only when it returns.

        The C part of Python's signal handler writes the signal number to the wakeup fd at once; a
        thread reading it calls :meth:`request`. A Python handler must be installed for the signal
        (Airflow's task runner installs one for SIGTERM; :meth:`installed` does). Off the main
        thread, or when another wakeup fd is set (an asyncio loop), it only yields: the handler path
        still works, after the blocking call.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:  # someone else's wakeup fd: leave it to them
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            yield self
            return
        wanted = {int(sig) for sig in signals}

        def watch() -> None:
            while data := reader.recv(64):  # b"" once the writer is closed
                if wanted & set(data):
                    self.request()

        thread = threading.Thread(target=watch, name="onceflow shutdown watch", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            signal.set_wakeup_fd(-1)
            writer.close()
            thread.join(5.0)
            reader.close()

    @contextlib.contextmanager
    def installed(self, signals: Sequence[int] = (signal.SIGTERM,)) -> Iterator[GracefulShutdown]:
        """Route ``signals`` to :meth:`request` (main thread only), restoring the old handlers."""
        previous = {sig: signal.signal(sig, self.request) for sig in signals}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
