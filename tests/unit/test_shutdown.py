"""GracefulShutdown: any number of signals set the flag and none interrupts the code running."""

from __future__ import annotations

import os
import signal

from onceflow.shutdown import GracefulShutdown


def test_repeated_signals_only_set_the_flag_and_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    before_int = signal.getsignal(signal.SIGINT)
    stop = GracefulShutdown()
    cleaned: list[int] = []
    with stop.installed((signal.SIGTERM, signal.SIGINT)):
        assert not stop.requested
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            # what onceflow up's clean-up faces: more signals while it runs (make forwards one)
            for i in range(50):
                os.kill(os.getpid(), signal.SIGTERM if i % 2 else signal.SIGINT)
                cleaned.append(i)
        assert stop.requested
    assert cleaned == list(range(50))
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is before_int


_REENTRY_CHILD = r"""
import signal, sys
from onceflow.shutdown import GracefulShutdown
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what installed() restores: late signals are harmless
stop = GracefulShutdown()
with stop.installed((signal.SIGTERM,)):
    print("ready", flush=True)
    # the main thread requests too (an Airflow task's on_kill, a wakeup-fd watcher): a signal
    # landing inside request() runs request() again on the same thread
    for _ in range(300_000):
        stop.request()
print("done", flush=True)
"""


def test_a_signal_landing_inside_request_does_not_deadlock_the_handler() -> None:
    """A request() interrupted by a signal is re-entered on the same thread: it must take no lock.

    threading.Event.set() holds a plain lock, so a SIGTERM arriving while the main thread was
    inside it made the nested handler wait for that lock forever (onceflow up hung during the
    make-run test's SIGTERM burst).
    """
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", _REENTRY_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            child.send_signal(signal.SIGTERM)  # a burst, as make and a user pressing Ctrl-C send
            time.sleep(0.001)
        assert child.poll() == 0, "request() deadlocked when a signal re-entered it"
        assert child.stdout.read().strip() == "done"
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
