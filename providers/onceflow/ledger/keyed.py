"""Leases on one named item, and results a sink committed that the ledger has to catch up on.

``claim`` hands out the best eligible item of a kind; an Airflow task that loads one known
partition needs *that* item instead (``daily_sales/2024-10-27``). :func:`lease_key` creates it if
missing, re-opens it if it finished earlier (a re-run or backfill of the day is a recheck), and
leases it with the same table events as ``claim`` (``claim`` / ``reclaim_expired``: token + 1).
A current lease of another owner is not taken: :class:`LeaseHeld`.

:func:`record_result` is the reconciler's half of a two-database commit: the sink (the warehouse)
committed under a ledger token, the holder died before ``commit_result``; the reconciler writes
the result with that token and moves the item to ``done`` (event ``record_result``).
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from onceflow.ledger import items, states
from onceflow.ledger.clock import db_now
from onceflow.ledger.commit import _stored_result, _upsert_result, requirement_met
from onceflow.ledger.errors import LeaseHeld, StaleFenceError, WrongVersion
from onceflow.ledger.leases import GAVE_UP, check_lease_seconds, poison_reason
from onceflow.ledger.models import Lease

if TYPE_CHECKING:
    from types import TracebackType

    from sqlalchemy.engine import Engine

REOPENABLE = frozenset({states.DONE, states.FAILED, states.NEEDS_CORRECTION})


def lease_key(
    engine: Engine,
    *,
    kind: str,
    work_key: str,
    owner: str,
    lease_seconds: float,
    worker_version: str,
    now: float | None,
    payload: Any = None,
    reopen_reason: str,
    max_attempts: int = 1000,
) -> Lease:
    """Lease ``work_key`` (created or re-opened as needed), fencing token + 1, in one transaction.

    :param now: ``None``: the database's clock decides (read in the transaction, after the row
        lock); a test's injected time otherwise.
    :param reopen_reason: recorded on the ``recheck`` transition when a finished item re-opens.
    :param max_attempts: attempt budget of a new item (Airflow's retries are the real budget).
    :raises LeaseHeld: another owner's lease is current.
    :raises WrongVersion: the item requires another processing version (nothing written; it is
        left for a worker running that version).
    :raises IllegalTransition: the item cannot run (cancelled).
    """
    check_lease_seconds(lease_seconds)
    with engine.begin() as conn:
        items.create_item(
            conn,
            kind=kind,
            work_key=work_key,
            now=db_now(conn, now),
            actor=states.PRODUCER,
            payload=payload,
            max_attempts=max_attempts,
            reason=f"created by {owner}",
        )
        item = items.lock_item(conn, work_key)
        assert item is not None
        # Read after the lock: a wait for the row must not make the holder's lease look younger.
        now = db_now(conn, now)
        required = item["required_version"]
        if required is not None and required != worker_version:
            raise WrongVersion(work_key, required, worker_version)  # rolls back: nothing written
        if _poison(item, now):
            # The lease of its last attempt expired: given up as a claim gives it up (recorded, the
            # attempt budget kept), then re-opened below like any failed item this task re-runs.
            reason = poison_reason({f"from_{k}": item[k] for k in _POISON_FIELDS})
            item = items.apply(
                conn,
                item,
                GAVE_UP,
                states.WORKER,
                {"now": now, "reason": reason},
                {"lease_expires_at": None, "last_error_class": "LeaseExpired", "last_error": reason},
                owner=owner,
            )
        if item["state"] in REOPENABLE:
            item = items.apply(
                conn,
                item,
                "recheck",
                states.RECHECK,
                {"now": now, "reason": reopen_reason},
                {"available_at": now, "lease_expires_at": None, "attempts": 0},
            )
        if item["state"] == states.LEASED:
            expires = item["lease_expires_at"]
            if expires is None or expires > now:
                raise LeaseHeld(work_key, item["lease_owner"], item["fencing_token"], expires)
        event = "claim" if item["state"] == states.PENDING else "reclaim_expired"
        token = int(item["fencing_token"]) + 1
        after = items.apply(
            conn,
            item,
            event,
            states.WORKER,
            {"now": now, "worker_version": worker_version, "token": token},
            {
                "lease_owner": owner,
                "lease_expires_at": now + float(lease_seconds),
                "fencing_token": token,
                "attempts": int(item["attempts"]) + 1,
            },
            owner=owner,
        )
    return Lease(
        work_key=work_key,
        kind=kind,
        owner=owner,
        token=token,
        expires_at=float(after["lease_expires_at"]),
        worker_version=worker_version,
        lease_seconds=float(lease_seconds),
        attempts=int(after["attempts"]),
        payload=json.loads(after["payload"]) if after["payload"] else None,
        lane=after["lane"],
        recheck_id=after["recheck_id"],
        reason=after["reason"],
    )


_POISON_FIELDS = ("lease_owner", "fencing_token", "attempts", "max_attempts")


def _poison(item: dict[str, Any], now: float) -> bool:
    """Leased, its lease expired, and that lease was the item's last attempt."""
    expires = item["lease_expires_at"]
    return (
        item["state"] == states.LEASED
        and expires is not None
        and expires <= now
        and item["attempts"] >= item["max_attempts"]
    )


def record_result(
    engine: Engine,
    *,
    work_key: str,
    step: str,
    processing_version: str,
    token: int,
    payload: Any,
    now: float | None,
    reason: str,
) -> bool:
    """Record a result a sink committed under ``token`` (actor ``reconciler``); idempotent.

    Nothing changes when a result with this token or a newer one is stored, or when a lease
    newer than ``token`` is current (its holder will commit). :return: whether it wrote.
    """
    with engine.begin() as conn:
        item = items.lock_item(conn, work_key)
        if item is None:
            return False
        now = db_now(conn, now)  # whether a newer lease is current: the database's clock decides
        stored = _stored_result(conn, work_key, step, processing_version)
        if stored is not None and stored.fencing_token >= token:
            return False
        if item["state"] == states.LEASED and item["fencing_token"] > token:
            expires = item["lease_expires_at"]
            if expires is None or expires > now:
                return False
        if item["state"] not in (states.PENDING, states.LEASED, states.DONE, states.FAILED):
            return False
        if item["state"] == states.FAILED and item["fencing_token"] != token:
            # a failed item takes only the result of its last attempt (a poison give-up whose
            # holder's sink committed before it died): the sink holds that work done, and no
            # newer lease exists; an older attempt's result stays refused
            return False
        lease = Lease(work_key, item["kind"], states.RECONCILER, token, now, processing_version, 0.0, 0)
        _upsert_result(conn, lease, step, processing_version, payload, [], now)
        cleared, done_reason = requirement_met(item, processing_version, reason)
        items.apply(
            conn,
            item,
            "record_result",
            states.RECONCILER,
            {"now": now, "reason": done_reason, "result_written": True, "token": token},
            {"lease_expires_at": None, **cleared},
        )
    return True


class Heartbeat:
    """Extend ``lease`` every third of its length from a daemon thread while the block runs.

    A lost lease (``StaleFenceError``) stops the heartbeats and is remembered in :attr:`lost`;
    the sink's fence refuses the late write anyway, so the work is not interrupted here.
    """

    def __init__(self, lease: Lease, interval: float | None = None) -> None:
        self.lease = lease
        self.interval = interval if interval is not None else max(lease.lease_seconds / 3.0, 0.05)
        self.lost: StaleFenceError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {lease.work_key}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.lease.heartbeat()
            except StaleFenceError as exc:
                self.lost = exc
                return
            except Exception:  # a ledger hiccup: try again next interval, the lease may still hold
                continue

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
