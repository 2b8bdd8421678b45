"""Worker processes for the ledger's concurrency, crash and shutdown tests (and for users' own).

Run as ``python -m onceflow.testing.ledger_processes MODE URL [options]``; each mode prints one
JSON line with what it did. Being real processes, they really race on the database and can
really be frozen (SIGSTOP), resumed (SIGCONT) and terminated (SIGTERM).

Modes:

* ``drain``: claim and commit items of ``--kind`` until none is claimable.
* ``hold``: claim one item, print ``claimed``, wait for a line on stdin, then commit it.
* ``shutdown``: run a :class:`~onceflow.ledger.worker.LedgerWorker` whose handler works until
  SIGTERM arrives, then either returns (``--on-term finish``) or gives up (``release``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _ledger(url: str) -> Any:
    from onceflow.ledger import Ledger, create_ledger_engine

    return Ledger(
        create_ledger_engine(url, pool_size=1) if url.startswith("postgresql") else create_ledger_engine(url)
    )


def _emit(data: dict[str, Any]) -> None:
    print(json.dumps(data), flush=True)


def drain(args: argparse.Namespace) -> None:
    from onceflow.ledger import StaleFenceError

    ledger = _ledger(args.url)
    owner = f"{args.owner}-{os.getpid()}"
    committed: list[str] = []
    errors: dict[str, int] = {}
    refused = 0
    while True:
        try:
            lease = ledger.claim(args.kind, owner, args.lease_seconds, args.version)
            if lease is None:
                break
            ledger.commit_result(lease, args.step, {"owner": owner, "token": lease.token})
            committed.append(lease.work_key)
        except StaleFenceError:
            refused += 1
        except Exception as exc:  # reported, so the test can count deadlocks and other errors
            name = type(getattr(exc, "orig", None) or exc).__name__
            errors[name] = errors.get(name, 0) + 1
            if sum(errors.values()) > 100:
                break
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
    args = parser.parse_args(argv)
    {"drain": drain, "hold": hold, "shutdown": shutdown}[args.mode](args)


if __name__ == "__main__":
    main()
