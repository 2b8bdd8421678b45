"""A worker process of one deployed processing version, for rolling-deployment tests.

``python -m onceflow.testing.version_worker LEDGER_URL NAME`` reads work keys from stdin, one a
line, and runs one keyed step for each (:func:`onceflow.ledger.steps.run_keyed_step`, kind
``article``, step ``process``), as an Airflow task of a per-item run would. Its version is the
deployed one (:func:`onceflow.versions.deployed_version`: set ``AIRFLOW__ONCEFLOW__WORKER_VERSION``
in its environment to play another deployment). For each key it answers one JSON line on stdout:
``{"key", "outcome", "version", "detail"}`` with outcome ``done`` (committed, or already done by
this run), ``deferred`` (the item requires another version: left alone), ``busy`` (another
worker's lease is current) or ``error`` (the exception's class and message). A test plays the
scheduler: it hands keys to workers and hands deferred ones out again.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def serve(url: str, name: str) -> None:
    from onceflow.ledger import LeaseHeld, Ledger, WrongVersion, create_ledger_engine
    from onceflow.ledger.steps import run_keyed_step
    from onceflow.versions import deployed_version

    ledger = Ledger(create_ledger_engine(url))
    version = deployed_version()
    print(json.dumps({"ready": name, "version": version}), flush=True)
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        answer: dict[str, Any] = {"key": key, "version": version, "detail": ""}
        try:
            run_keyed_step(
                ledger,
                kind="article",
                work_key=key,
                step="process",
                owner=f"{name}/{key}",
                worker_version=version,
                work=lambda lease: {"processed_by": name, "version": version},
                reuse_prefix=f"{name}/{key}",
            )
            answer["outcome"] = "done"
        except WrongVersion as exc:
            answer.update(outcome="deferred", detail=str(exc))
        except LeaseHeld as exc:
            answer.update(outcome="busy", detail=str(exc))
        except Exception as exc:
            answer.update(outcome="error", detail=f"{type(exc).__name__}: {exc}")
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
