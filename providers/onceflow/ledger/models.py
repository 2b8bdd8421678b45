"""Plain records the ledger hands out: leases, items, transitions, results, follow-ups."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from onceflow.ledger.core import Ledger

DAG_RUN = "dag_run"
ASSET_EVENT = "asset_event"
WORK_ITEM = "work_item"
#: a write to one row of a sheet queue, relayed by ``onceflow.sheets.relay`` (not by Airflow's relay)
SHEET_ROW = "sheet_row"
#: the outbox rows :class:`~onceflow.ledger.outbox.OutboxRelay` delivers to Airflow
AIRFLOW_TARGETS = (DAG_RUN, ASSET_EVENT)

_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.~:+-]")


def stable_run_id(*parts: str) -> str:
    """A deterministic, Airflow-safe run id built from ``parts`` (so a second trigger is refused)."""
    raw = "__".join(parts)
    safe = _RUN_ID_UNSAFE.sub("-", raw)
    if len(safe) > 200 or safe != raw:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:12]
        safe = f"{safe[:180]}-{digest}"
    return f"onceflow__{safe}"


@dataclass
class Lease:
    """Temporary ownership of one work item, proven by its fencing token.

    Only the holder of the newest token may commit; every grant increments the token.
    """

    work_key: str
    kind: str
    owner: str
    token: int
    expires_at: float
    worker_version: str
    lease_seconds: float
    attempts: int
    payload: Any = None
    lane: str = "new"
    recheck_id: int | None = None
    reason: str | None = None
    _ledger: Ledger | None = field(default=None, repr=False, compare=False)

    def heartbeat(self, lease_seconds: float | None = None) -> Lease:
        """Extend this lease; raises ``StaleFenceError`` when a newer lease exists."""
        assert self._ledger is not None, "lease not bound to a ledger"
        return self._ledger.heartbeat(self, lease_seconds)

    def release(self, reason: str = "released") -> bool:
        """Give the item back untouched; ``False`` if the lease was already lost."""
        assert self._ledger is not None, "lease not bound to a ledger"
        return self._ledger.release(self, reason)


@dataclass(frozen=True)
class WorkItem:
    """A row of ``work_items``: the item's state, lease, fencing token, attempts and payload."""

    work_key: str
    kind: str
    state: str
    priority: int
    available_at: float
    lease_owner: str | None
    lease_expires_at: float | None
    fencing_token: int
    attempts: int
    max_attempts: int
    last_error_class: str | None
    last_error: str | None
    reason: str | None
    payload: Any
    created_at: float
    updated_at: float
    required_version: str | None
    lane: str
    recheck_id: int | None

    @classmethod
    def from_row(cls, row: Any) -> WorkItem:
        """Build from a ``work_items`` row (the payload decoded from JSON)."""
        m = dict(row._mapping)
        m.pop("id", None)
        m["payload"] = json.loads(m["payload"]) if m.get("payload") else None
        return cls(**m)


@dataclass(frozen=True)
class TransitionRecord:
    """A row of ``transitions``: one state change of an item, who made it and why."""

    work_key: str
    event: str
    from_state: str | None
    to_state: str | None
    actor: str
    owner: str | None
    fencing_token: int | None
    at: float
    reason: str | None


@dataclass(frozen=True)
class ResultRecord:
    """A row of ``results``: a step's committed payload, its processing version and fencing token."""

    work_key: str
    step: str
    processing_version: str
    fencing_token: int
    payload: Any
    committed_by: str | None
    committed_at: float
    follow_ups: list[dict[str, Any]]

    @classmethod
    def from_row(cls, m: Mapping[Any, Any]) -> ResultRecord:
        """A ``results`` row as read (payload and follow-ups are stored as JSON text)."""
        return cls(
            work_key=m["work_key"],
            step=m["step"],
            processing_version=m["processing_version"],
            fencing_token=m["fencing_token"],
            payload=json.loads(m["payload"]) if m["payload"] else None,
            committed_by=m["committed_by"],
            committed_at=m["committed_at"],
            follow_ups=json.loads(m["follow_ups"]) if m["follow_ups"] else [],
        )


@dataclass(frozen=True)
class FollowUp:
    """Work that must follow a committed result; written in the result's transaction.

    ``dag_run`` and ``asset_event`` follow-ups go to the outbox and a relay delivers them to
    Airflow; ``work_item`` follow-ups create the next ledger item directly (same database).
    Build them with the class methods.
    """

    target_type: str
    target: str
    payload: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    priority: int = 0
    required_version: str | None = None

    @classmethod
    def dag_run(cls, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None) -> FollowUp:
        """Trigger ``dag_id`` once; ``run_id`` defaults to one derived from the result's key."""
        return cls(DAG_RUN, dag_id, conf or {}, run_id)

    @classmethod
    def asset_event(cls, uri: str, extra: dict[str, Any] | None = None) -> FollowUp:
        """Emit one Asset event for ``uri``."""
        return cls(ASSET_EVENT, uri, extra or {})

    @classmethod
    def work_item(
        cls,
        kind: str,
        work_key: str,
        payload: dict[str, Any] | None = None,
        *,
        priority: int = 0,
        required_version: str | None = None,
    ) -> FollowUp:
        """Create the next ledger work item (e.g. the ``translate`` step after ``fetch``)."""
        return cls(WORK_ITEM, kind, payload or {}, work_key, priority, required_version)

    @classmethod
    def sheet_row(cls, sheet: str, payload: dict[str, Any], key: str | None = None) -> FollowUp:
        """Write one row of the sheet queue ``sheet`` (``<spreadsheet id>/<tab>``): the row's
        final status and fields, by its claim token (``onceflow.sheets.relay`` builds these).

        :param key: the row's own deduplication key, for a write no lease commits
            (:meth:`~onceflow.ledger.core.Ledger.enqueue`); default: keyed by the committing attempt.
        """
        return cls(SHEET_ROW, sheet, payload, key)

    def resolved(self, work_key: str, step: str, version: str, token: int) -> dict[str, Any]:
        """The stored form, with its deduplication key fixed.

        Outbox follow-ups are keyed by the attempt that committed them (``token``, the lease's
        fencing token): a retry of one commit repeats the key and changes nothing, while a
        recheck at the same version is a new lease, so its result brings its own run or event.
        An explicit ``key`` (a run id the caller chose) is used as given.
        """
        if self.target_type == DAG_RUN:
            run_id = self.key or stable_run_id(work_key, step, version, f"t{token}")
            dedup = f"dag_run:{self.target}:{run_id}"
            key = run_id
        elif self.target_type in (ASSET_EVENT, SHEET_ROW):
            key = self.key or f"{work_key}:{step}:{version}:t{token}"
            dedup = f"{self.target_type}:{self.target}:{key}"
        elif self.target_type == WORK_ITEM:
            assert self.key, "work_item follow-ups need a work key"
            key = self.key
            dedup = f"work_item:{key}"
        else:
            raise ValueError(f"unknown follow-up type {self.target_type!r}")
        return {
            "type": self.target_type,
            "target": self.target,
            "key": key,
            "dedup_key": dedup,
            "payload": self.payload,
            "priority": self.priority,
            "required_version": self.required_version,
        }
