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


def pids_in_sessions(sessions: set[int]) -> list[int]:
    """PIDs of live (non-zombie) processes whose session id is one of ``sessions``."""
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z" and int(fields[3]) in sessions:
            found.append(int(entry.name))
    return found


def harness_pids(name: str, value: str, sessions: set[int] | None = None) -> list[int]:
    """Every live process carrying the marker or belonging to one of the harness's sessions."""
    return sorted(set(pids_with_marker(name, value)) | set(pids_in_sessions(sessions or set())))


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
