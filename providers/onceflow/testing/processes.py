"""Find and end every process a harness started, including grandchildren that left the group.

Two nets, because each misses something: each harness run exports a unique marker variable that
every descendant inherits (found by scanning ``/proc/*/environ``, even after setsid()), and each
component starts its own session (found by the session id in ``/proc/*/stat``, even after
setproctitle() has overwritten the environment block, as Airflow's LocalExecutor workers do).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def harness_pids(name: str, value: str, sessions: set[int] | None = None) -> list[int]:
    """Live processes carrying ``name=value`` in their environment or in one of ``sessions``.

    One pass over ``/proc``: ``stat`` gives the state and session id, and ``environ`` is read
    only for processes the session test did not already claim.
    """
    needle = f"{name}={value}".encode()
    sessions = sessions or set()
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            # Fields after the parenthesised command: state ppid pgrp session ...
            fields = stat[stat.rfind(")") + 2 :].split()
            if not fields or fields[0] == "Z":
                continue
            if int(fields[3]) in sessions or needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def pids_with_marker(name: str, value: str) -> list[int]:
    """Live processes whose environment holds ``name=value`` (Linux ``/proc``)."""
    return harness_pids(name, value)


def terminate_marked(
    name: str, value: str, grace: float = 10.0, sessions: set[int] | None = None
) -> list[int]:
    """SIGTERM every harness process, wait up to ``grace`` seconds, then SIGKILL what is left.

    :param sessions: session ids the harness created (``start_new_session=True`` children).
    :returns: the PIDs that had to be killed with SIGKILL.
    """
    for pid in harness_pids(name, value, sessions):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and harness_pids(name, value, sessions):
        time.sleep(0.2)
    killed = harness_pids(name, value, sessions)
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and harness_pids(name, value, sessions):
        time.sleep(0.1)
    return killed


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
