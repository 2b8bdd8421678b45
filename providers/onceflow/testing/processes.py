"""Find and end every process a harness started, including grandchildren that left the group.

Each harness run exports a unique marker variable; every descendant inherits the environment,
so scanning ``/proc/*/environ`` for the marker finds them all, even ones that called setsid().
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def pids_with_marker(name: str, value: str) -> list[int]:
    """PIDs of live processes whose environment holds ``name=value`` (Linux ``/proc``)."""
    needle = f"{name}={value}".encode()
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "State:\tZ" in status:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def terminate_marked(name: str, value: str, grace: float = 10.0) -> list[int]:
    """SIGTERM every marked process, wait up to ``grace`` seconds, then SIGKILL what is left.

    :returns: the PIDs that had to be killed with SIGKILL.
    """
    for pid in pids_with_marker(name, value):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pids_with_marker(name, value):
        time.sleep(0.2)
    killed = pids_with_marker(name, value)
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pids_with_marker(name, value):
        time.sleep(0.1)
    return killed


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
