"""Find and end every process a harness started, including grandchildren that left the group.

Two nets, because each misses something: each harness run exports a unique marker variable that
every descendant inherits (found by scanning ``/proc/*/environ``, even after setsid()), and each
component starts its own session (found by the session id in ``/proc/*/stat``, even after
setproctitle() has overwritten the environment block, as Airflow's LocalExecutor workers do).

A session id is a PID number, so it is only ours while that number cannot be handed out again.
Linux keeps a number allocated while any process uses it as its PID, group or session id: session
S stays ours while its leader is unreaped (alive or a zombie) or any member lives.
:class:`~onceflow.testing.airflow_cluster.AirflowCluster` therefore reaps its leaders only once
their sessions are empty, and passes each leader's start time, so a session whose leader PID now
belongs to another process is ignored.

``python -m onceflow.testing.processes NAME VALUE`` is the watchdog a cluster starts beside its
components (see :func:`watch`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any

#: Session ids, or session id -> start time of its leader (:func:`start_ticks`).
Sessions = Collection[int] | Mapping[int, int]


def _stat_fields(proc: Path) -> list[str]:
    stat = (proc / "stat").read_text()
    # Fields after the parenthesised command: state ppid pgrp session ... (field 3 onwards).
    return stat[stat.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22); None if gone."""
    try:
        return int(_stat_fields(Path(f"/proc/{pid}"))[19])
    except (OSError, IndexError, ValueError):
        return None


def _trusted_sessions(sessions: Sessions | None) -> set[int]:
    if not sessions:
        return set()
    if not isinstance(sessions, Mapping):
        return set(sessions)
    # A live process with the leader's PID but another start time means the PID was reused: the
    # session with that id (if any) is someone else's.
    return {sid for sid, ticks in sessions.items() if start_ticks(sid) in (ticks, None)}


def exit_code_unreaped(proc: subprocess.Popen[Any]) -> int | None:
    """The exit code of a finished child *without reaping it*; None while it runs.

    An unreaped child keeps its PID allocated, so its session id cannot be handed to an unrelated
    process before the session has been swept (``Popen.poll`` would reap).
    """
    if proc.returncode is not None:
        return int(proc.returncode)
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere (a waitpid(-1) in some library)
        return proc.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def harness_pids(name: str, value: str, sessions: Sessions | None = None) -> list[int]:
    """Live processes carrying ``name=value`` in their environment or in one of ``sessions``.

    One pass over ``/proc``: ``stat`` gives the state and session id, and ``environ`` is read
    only for processes the session test did not already claim.
    """
    needle = f"{name}={value}".encode()
    trusted = _trusted_sessions(sessions)
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fields = _stat_fields(entry)
            if not fields or fields[0] == "Z":
                continue
            if int(fields[3]) in trusted or needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid`` and their descendants, even those that left it (setsid)."""
    parents: dict[int, int] = {}
    members: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(entry)
        except (OSError, IndexError, ValueError):
            continue
        if not fields or fields[0] == "Z":
            continue
        parents[int(entry.name)] = int(fields[1])
        if int(fields[3]) == sid:
            members.add(int(entry.name))
    grown = True
    while grown:
        children = {pid for pid, ppid in parents.items() if ppid in members} - members
        members |= children
        grown = bool(children)
    return sorted(members)


def pids_with_marker(name: str, value: str) -> list[int]:
    """Live processes whose environment holds ``name=value`` (Linux ``/proc``)."""
    return harness_pids(name, value)


def terminate_marked(
    name: str, value: str, grace: float = 10.0, sessions: Sessions | None = None
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
    # PermissionError: the PID now belongs to another user's process; skipping it lets the
    # caller reach its SIGKILL pass for the rest.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def watch(name: str, value: str, commands: IO[bytes], grace: float = 15.0) -> bool:
    """The watchdog's body: read ``session <sid> <start ticks>`` lines until ``done`` or EOF.

    The harness process holds the only write end of ``commands``; EOF without ``done`` means it
    died (even by SIGKILL) or dropped a running cluster, so sweep the marker and sessions.

    :returns: whether it swept.
    """
    leaders: dict[int, int] = {}
    for line in commands:
        parts = line.split()
        if parts == [b"done"]:
            return False
        if len(parts) == 3 and parts[0] == b"session":
            leaders[int(parts[1])] = int(parts[2])
    killed = terminate_marked(name, value, grace, leaders)
    print(f"swept {name}={value} sessions={sorted(leaders)}; SIGKILLed {killed}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sweep a test cluster when its harness dies.")
    parser.add_argument("name", help="marker variable")
    parser.add_argument("value", help="marker value")
    args = parser.parse_args(argv)
    watch(args.name, args.value, sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
