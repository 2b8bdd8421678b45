"""CPU seconds the machine spent, by component: a per-run cost that the scheduler's timing cannot blur.

A backfill's wall time per run depends on when Airflow's scheduler wakes and when a supervisor
notices its task has exited (benchmarks/README.md, issue 27): a side that is slower by a few
milliseconds can land a whole scheduler sleep later. The CPU the machine spends moves far less
with that timing (only the idle loops of the scheduler and dag-processor grow with the wall time),
so the benchmarks print it beside the wall figure. ``postgres`` is every PostgreSQL server on the
machine and ``machine`` every core (steal time included): run them on an otherwise idle machine.

A process tree's CPU is, over its live processes, user + system time plus the time of the children
each has reaped (a task process is reaped by its LocalExecutor worker, a backend by the
postmaster), so a process that came and went inside the measured span is counted once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import psutil


def tree_cpu(root: int, attempts: int = 5) -> float:
    """CPU seconds of ``root`` and its live descendants, with everything they have reaped.

    A descendant that vanishes during the read may have been reaped after its parent was read, so
    its time is in neither: the tree is read again (up to ``attempts`` times).
    """
    total = 0.0
    for _ in range(attempts):
        try:
            top = psutil.Process(root)
            processes = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total, vanished = 0.0, False
        for process in processes:
            try:
                t = process.cpu_times()
            except psutil.NoSuchProcess:
                vanished = True
                break
            total += t.user + t.system + t.children_user + t.children_system
        if not vanished:
            return total
    return total


def postmaster_pids() -> list[int]:
    """Every PostgreSQL postmaster on this machine (a ``postgres`` process whose parent is not one)."""
    found = []
    for process in psutil.process_iter(["name", "ppid"]):
        if process.info["name"] not in ("postgres", "postmaster"):
            continue
        try:
            parent = psutil.Process(process.info["ppid"]).name()
        except psutil.NoSuchProcess:
            parent = ""
        if parent not in ("postgres", "postmaster"):
            found.append(process.pid)
    return found


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores; /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def snapshot(components: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each component's tree, of PostgreSQL, and of the whole machine."""
    out = {name: tree_cpu(pid) for name, pid in components.items()}
    out["postgres"] = sum(tree_cpu(pid) for pid in postmaster_pids())
    out["machine"] = machine_busy()
    return out


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds per component between two snapshots; a component in only one of them (it started
    or ended in between, e.g. restarted) is left out rather than charged its lifetime."""
    return {name: after[name] - before[name] for name in after if name in before}
