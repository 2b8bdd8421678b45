"""Run a test double's server in the foreground until SIGTERM or SIGINT (its command line)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def serve_until_signalled(serve_forever: Callable[[], None], stop: Callable[[], None]) -> None:
    """Call ``serve_forever`` on this thread; SIGTERM/SIGINT call ``stop`` once, on another thread
    (``stop`` waits for ``serve_forever`` to return, so the signal handler cannot call it itself).
    """
    stopper: list[threading.Thread] = []

    def _stop(signum: int, frame: object) -> None:
        if not stopper:
            stopper.append(threading.Thread(target=stop))
            stopper[0].start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        serve_forever()
    finally:
        if stopper:
            stopper[0].join()
        else:
            stop()
