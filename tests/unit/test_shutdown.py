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
