"""Worker processes for the ledger's concurrency, crash and shutdown tests (and for users' own).

Run as ``python -m onceflow.testing.ledger_processes MODE URL [options]`` (or :func:`spawn`); each
mode prints one JSON line with what it did (:func:`read_json`). Being real processes, they really race on the database and can
really be frozen (SIGSTOP), resumed (SIGCONT) and terminated (SIGTERM).

Modes:

* ``drain``: claim and commit items of ``--kind`` until none is claimable (``--batch N``: lease up
  to N items per claim, then commit them one by one).
* ``hold``: claim one item, print ``claimed``, wait for a line on stdin, then commit it.
* ``shutdown``: run a :class:`~onceflow.ledger.worker.LedgerWorker` whose handler works until
  SIGTERM arrives, then either returns (``--on-term finish``) or gives up (``release``).

``--clock-skew SECONDS`` makes the process's wall clock (``time.time()``) run that far ahead
(negative: behind), as on a host whose clock is wrong: the lease decisions must not notice.
Moving the real system clock needs root and would move every process on the machine, so the skew
is applied inside the process; the database's clock stays right.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

MODULE = "onceflow.testing.ledger_processes"


def spawn(*args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """Start ``python -m onceflow.testing.ledger_processes *args`` with its stdout piped."""
    return subprocess.Popen(
        [sys.executable, "-m", MODULE, *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        text=True,
    )


def read_json(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The next JSON line the worker printed (fails clearly if it exited instead)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"worker {proc.pid} exited early with {proc.wait()}"
    return dict(json.loads(line))


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """Kill (after resuming, in case a test froze it) and reap every worker still running."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()


def _ledger(url: str) -> Any:
    from onceflow.ledger import Ledger, create_ledger_engine

    return Ledger(
        create_ledger_engine(url, pool_size=1) if url.startswith("postgresql") else create_ledger_engine(url)
    )


def _emit(data: dict[str, Any]) -> None:
    print(json.dumps(data), flush=True)


def skew_clock(seconds: float) -> None:
    """Make this process's ``time.time()`` / ``time.time_ns()`` run ``seconds`` off."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + seconds
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)


def drain(args: argparse.Namespace) -> None:
    from onceflow.ledger import StaleFenceError

    ledger = _ledger(args.url)
    owner = f"{args.owner}-{os.getpid()}"
    committed: list[str] = []
    errors: dict[str, int] = {}
    refused = 0
    while True:
        try:
            leases = ledger.claim_many(args.kind, owner, args.lease_seconds, args.version, limit=args.batch)
        except Exception as exc:  # reported, so the test can count deadlocks and other errors
            name = type(getattr(exc, "orig", None) or exc).__name__
            errors[name] = errors.get(name, 0) + 1
            if sum(errors.values()) > 100:
                break
            continue
        if not leases:
            break
        for lease in leases:
            try:
                ledger.commit_result(lease, args.step, {"owner": owner, "token": lease.token})
                committed.append(lease.work_key)
            except StaleFenceError:
                refused += 1
            except Exception as exc:
                name = type(getattr(exc, "orig", None) or exc).__name__
                errors[name] = errors.get(name, 0) + 1
    _emit({"owner": owner, "committed": committed, "refused": refused, "errors": errors})


def hold(args: argparse.Namespace) -> None:
    from onceflow.ledger import StaleFenceError

    ledger = _ledger(args.url)
    lease = ledger.claim(args.kind, args.owner, args.lease_seconds, args.version)
    if lease is None:
        _emit({"claimed": None})
        return
    _emit({"claimed": lease.work_key, "token": lease.token})
    sys.stdin.readline()  # "working" until the test says go (it may freeze us meanwhile)
    try:
        ledger.commit_result(lease, args.step, {"owner": args.owner})
        _emit({"committed": True})
    except StaleFenceError as exc:
        _emit({"committed": False, "error": "StaleFenceError", "current_token": exc.current_token})


def shutdown(args: argparse.Namespace) -> None:
    from onceflow.ledger.worker import LedgerWorker, ShutdownRequested
    from onceflow.shutdown import GracefulShutdown

    ledger = _ledger(args.url)
    stop = GracefulShutdown()

    def handler(lease: Any) -> dict[str, Any]:
        _emit({"working": lease.work_key})
        while not stop.requested:
            time.sleep(0.01)
        if args.on_term == "release":
            raise ShutdownRequested
        return {"finished": lease.work_key}

    worker = LedgerWorker(
        ledger,
        kind=args.kind,
        step=args.step,
        owner=args.owner,
        worker_version=args.version,
        handler=handler,
        lease_seconds=args.lease_seconds,
        shutdown=stop,
    )
    with stop.installed():
        report = worker.run()
    _emit(report.as_dict())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m onceflow.testing.ledger_processes")
    parser.add_argument("mode", choices=["drain", "hold", "shutdown"])
    parser.add_argument("url")
    parser.add_argument("--kind", default="work")
    parser.add_argument("--step", default="process")
    parser.add_argument("--owner", default="worker")
    parser.add_argument("--version", default="v1")
    parser.add_argument("--lease-seconds", type=float, default=60.0)
    parser.add_argument("--on-term", choices=["finish", "release"], default="finish")
    parser.add_argument("--batch", type=int, default=1, help="drain: items leased per claim")
    parser.add_argument("--clock-skew", type=float, default=0.0, help="seconds this process's clock is off")
    args = parser.parse_args(argv)
    if args.clock_skew:
        skew_clock(args.clock_skew)
    {"drain": drain, "hold": hold, "shutdown": shutdown}[args.mode](args)


if __name__ == "__main__":
    main()
