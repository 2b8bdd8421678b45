"""What the watchdog's fault-schedule checkers cost, and how fast a hung ledger is paged (issue 28).

Side by side in one run, load average printed (read the ratios on a shared machine):

* the in-process checker (``onceflow.testing.watchdog_faults``: replicas on a fake clock), wall
  and CPU per schedule, on one process;
* the real-process checker (``onceflow.testing.watchdog_process_faults``: ``onceflow-watchdog``
  processes, PostgreSQL behind a freezable proxy, the receiver as a process), wall and CPU per
  schedule (this process and its children);
* from the real-process schedules that freeze the ledger: seconds from the freeze to the first
  ``watchdog.blind.pass`` DOWN the receiver recorded, against the pass budget.

``python benchmarks/bench_watchdog_checkers.py [--inproc 20] [--seeds 0,2,9,17,23,3]``; needs
PostgreSQL (``ONCEFLOW_TEST_DATABASE_URL``, default 127.0.0.1:5432).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inproc", type=int, default=20, help="in-process schedules (seeds 0..n-1)")
    parser.add_argument("--seeds", default="0,2,9,17,23,3", help="real-process seeds")
    args = parser.parse_args()

    from onceflow.testing import postgres
    from onceflow.testing import watchdog_process_faults as real
    from onceflow.testing.watchdog_faults import check_promises, generate, run_schedule

    print(f"load average before: {os.getloadavg()}")
    root = Path(tempfile.mkdtemp(prefix="bench-wd-"))
    walls, cpus = [], []
    for seed in range(args.inproc):
        w, c = time.monotonic(), _cpu()
        assert not check_promises(run_schedule(generate(seed), root / f"i{seed}"))
        walls.append(time.monotonic() - w)
        cpus.append(_cpu() - c)
    inproc = (statistics.median(walls), statistics.median(cpus))
    print(f"in-process: {args.inproc} schedules, median {inproc[0]:.2f} s wall, {inproc[1]:.2f} s CPU each")

    rwalls, rcpus, hangs = [], [], []
    for seed in (int(s) for s in args.seeds.split(",") if s):
        url = postgres.create_database("benchwd")
        w, c = time.monotonic(), _cpu()
        try:
            outcome = real.run_schedule(real.generate(seed), root / f"r{seed}", url)
        finally:
            postgres.drop_database(url)
        rwalls.append(time.monotonic() - w)
        rcpus.append(_cpu() - c)
        problems = check_promises(outcome)
        frozen = [
            float(m.group(1)) for line in outcome.log if (m := re.match(r"t=([\d.]+) .* ledger_hang", line))
        ]
        for start in frozen:
            pages = [
                m["t"] - start
                for m in outcome.messages
                if m.get("check") == "watchdog.blind.pass" and m["kind"] == "down" and m["t"] >= start
            ]
            if pages:
                hangs.append(min(pages))
        print(
            f"real seed {seed} ({real.generate(seed).profile}): {rwalls[-1]:.0f} s wall, {rcpus[-1]:.1f} s CPU, "
            f"{len(outcome.messages)} messages, {len(problems)} broken promises, load {os.getloadavg()[0]:.1f}"
        )
    if rwalls:
        real_med = (statistics.median(rwalls), statistics.median(rcpus))
        print(
            f"real-process: {len(rwalls)} schedules, median {real_med[0]:.0f} s wall, {real_med[1]:.1f} s CPU each; "
            f"{real_med[0] / inproc[0]:.0f}x the wall and {real_med[1] / inproc[1]:.1f}x the CPU of an in-process one"
        )
    if hangs:
        print(
            f"hung ledger -> watchdog.blind.pass DOWN: {len(hangs)} freezes, median {statistics.median(hangs):.1f} s, "
            f"max {max(hangs):.1f} s (budget {real.PASS_BUDGET:.0f} s, loop {real.LOOP} s; "
            f"median {statistics.median(hangs) / real.PASS_BUDGET:.2f}x the budget)"
        )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
