"""Reconciliation: find broken invariants in the ledger and repair them as recorded operations.

Checks (each repair is idempotent and written as a transition with actor ``reconciler``):

* **expired leases still active**: ``leased`` items whose lease expired more than ``grace``
  seconds ago (by the database's clock) go back to ``pending`` (event ``expire``), or, when that
  was their last attempt, to ``failed`` (event ``give_up_expired``: a poison item).
* **results without their follow-up**: every follow-up a committed result promised
  (``results.follow_ups``) must exist in the outbox or as a work item; a missing one is
  re-created (event ``repair_follow_up``).
* **a stalled relay**: outbox rows pending for longer than ``relay_stall_seconds``. With a sink
  the reconciler relays them itself and records ``repair_follow_up`` on each item; without one
  it only reports.
* **runs Airflow does not have** (with ``run_exists``): a ``dag_run`` row marked relayed whose
  run is missing in Airflow (deleted, or lost) goes back to pending for the relay
  (``repair_follow_up``).

Further checks (the sheet, Airflow's runs) plug in as ``extra_checks``: callables taking the
ledger and returning findings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger import commit, items, schema, states
from onceflow.ledger.clock import db_now, statement_now
from onceflow.ledger.outbox import OutboxRelay
from onceflow.ledger.queries import query

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.outbox import AirflowSink


@dataclass
class Finding:
    """One broken invariant found by reconciliation, and whether it was repaired."""

    check: str
    work_key: str | None
    detail: str
    repaired: bool


@dataclass
class ReconcileReport:
    """Everything one reconciliation pass found and did."""

    findings: list[Finding] = field(default_factory=list)
    relay_stalled: bool = False
    oldest_pending_outbox_age: float | None = None
    awaiting: list[int] = field(default_factory=list)  # outbox rows to confirm when the task succeeds

    def count(self, check: str, *, repaired: bool | None = None) -> int:
        """How many findings of ``check`` (only repaired or unrepaired ones when ``repaired`` is given)."""
        return sum(
            1 for f in self.findings if f.check == check and (repaired is None or f.repaired == repaired)
        )

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the task's XCom)."""
        return {
            "relay_stalled": self.relay_stalled,
            "oldest_pending_outbox_age": self.oldest_pending_outbox_age,
            "awaiting": self.awaiting,
            "findings": [f.__dict__ for f in self.findings],
        }


ExtraCheck = Callable[["Ledger"], list[Finding]]
RunExists = Callable[[str, str], bool]


def expire_stale_leases(ledger: Ledger, *, grace_seconds: float = 0.0, limit: int = 1000) -> list[Finding]:
    """Return expired-but-active leases to pending, or give them up when no attempt is left.

    Expiry is judged by the database's clock (or a test's injected clock), in the query that
    finds them and again under each row's lock: a heartbeat that came in between wins.
    """
    injected = statement_now(ledger.clock)
    name = "expired_leases_sqlite" if ledger.engine.dialect.name == "sqlite" else "expired_leases_postgresql"
    with ledger.engine.connect() as conn:
        keys = list(
            conn.execute(query(name), {"now": injected, "grace": grace_seconds, "limit": limit}).scalars()
        )
    found = []
    for key in keys:
        with ledger.engine.begin() as conn:
            item = items.lock_item(conn, key)
            now = db_now(conn, injected)
            if (
                item is None
                or item["state"] != states.LEASED
                or item["lease_expires_at"] > now - grace_seconds
            ):
                continue  # its holder heartbeat or finished meanwhile
            dead = f"lease of {item['lease_owner']} (token {item['fencing_token']}) expired at {item['lease_expires_at']}"
            updates: dict[str, Any] = {"lease_expires_at": None}
            if item["attempts"] < item["max_attempts"]:
                event, reason = "expire", dead
                updates["available_at"] = now
            else:  # a poison item: its last attempt died too
                event = "give_up_expired"
                reason = (
                    f"{dead} on attempt {item['attempts']} of {item['max_attempts']}: given up, not retried"
                )
                updates.update(last_error_class="LeaseExpired", last_error=reason)
            items.apply(conn, item, event, states.RECONCILER, {"now": now, "reason": reason}, updates)
        found.append(Finding("expired_lease", key, reason, repaired=True))
    return found


def repair_missing_follow_ups(ledger: Ledger) -> list[Finding]:
    """Re-create follow-ups that a committed result promised but that do not exist."""
    r, o, w = schema.results, schema.outbox, schema.work_items
    with ledger.engine.connect() as conn:
        promised = conn.execute(
            sa.select(r.c.work_key, r.c.step, r.c.follow_ups).where(r.c.follow_ups.is_not(None))
        ).all()
        outbox_keys = set(conn.execute(sa.select(o.c.dedup_key)).scalars())
        work_keys = set(conn.execute(sa.select(w.c.work_key)).scalars())
    found = []
    for work_key, step, raw in promised:
        for spec in json.loads(raw):
            exists = (
                spec["key"] in work_keys if spec["type"] == "work_item" else spec["dedup_key"] in outbox_keys
            )
            if exists:
                continue
            now = ledger.clock.now()
            reason = f"result {step!r} promised {spec['dedup_key']} but it was missing; re-created"
            created = False
            with ledger.engine.begin() as conn:
                item = items.lock_item(conn, work_key)
                # Only a finished item's promise is repaired; a re-opened one will commit again.
                if item is not None and item["state"] == states.DONE:
                    created = commit.write_follow_up(
                        conn, spec, work_key=work_key, step=step, now=now, actor=states.RECONCILER
                    )
                    if created:
                        ctx = {"now": now, "reason": reason}
                        items.apply(conn, item, "repair_follow_up", states.RECONCILER, ctx)
            if created:
                found.append(Finding("missing_follow_up", work_key, reason, repaired=True))
    return found


def check_relay(
    ledger: Ledger, report: ReconcileReport, *, relay_stall_seconds: float, sink: AirflowSink | None
) -> None:
    """Flag a stalled relay; with a sink, deliver the stuck rows and record it per item."""
    now = ledger.clock.now()
    with ledger.engine.connect() as conn:
        oldest = conn.execute(query("outbox_oldest_pending")).scalar()
    report.oldest_pending_outbox_age = None if oldest is None else now - oldest
    if oldest is None or now - oldest < relay_stall_seconds:
        return
    report.relay_stalled = True
    o = schema.outbox
    with ledger.engine.connect() as conn:
        stuck = conn.execute(
            sa.select(o.c.id, o.c.work_key, o.c.dedup_key).where(
                o.c.state == "pending", o.c.created_at <= now - relay_stall_seconds
            )
        ).all()
    if sink is None:
        for _, work_key, dedup in stuck:
            report.findings.append(Finding("stalled_relay", work_key, f"{dedup} not relayed", repaired=False))
        return
    relayed = OutboxRelay(ledger, sink, name="reconciler").relay_once()
    report.awaiting += relayed.awaiting
    with ledger.engine.connect() as conn:
        still = set(conn.execute(sa.select(o.c.id).where(o.c.state == "pending")).scalars())
    for row_id, work_key, dedup in stuck:
        # handed to this task's outlet: durable when the task succeeds (it confirms the row then)
        repaired = row_id not in still or row_id in relayed.awaiting
        if repaired:
            with ledger.engine.begin() as conn:
                item = items.lock_item(conn, work_key)
                if item is not None and item["state"] == states.DONE:
                    items.apply(
                        conn,
                        item,
                        "repair_follow_up",
                        states.RECONCILER,
                        {
                            # read on this transaction's connection, not a second one from the pool
                            "now": db_now(conn, statement_now(ledger.clock)),
                            "reason": f"relay stalled; reconciler relayed {dedup}",
                        },
                    )
        report.findings.append(
            Finding("stalled_relay", work_key, f"{dedup} stuck in outbox", repaired=repaired)
        )


def requeue_missing_runs(
    ledger: Ledger, run_exists: RunExists, *, settle_seconds: float = 300.0, limit: int = 200
) -> list[Finding]:
    """Put relayed ``dag_run`` rows whose run Airflow lacks back to pending (newest ``limit``).

    :param run_exists: ``(dag_id, run_id) -> bool``, asked of Airflow.
    :param settle_seconds: rows relayed more recently are not checked yet.
    """
    o = schema.outbox
    now = ledger.clock.now()
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            sa.select(o.c.id, o.c.work_key, o.c.target, o.c.payload)
            .where(
                o.c.state == "relayed", o.c.target_type == "dag_run", o.c.relayed_at <= now - settle_seconds
            )
            .order_by(o.c.id.desc())
            .limit(limit)
        ).all()
    found = []
    for row_id, work_key, dag_id, payload in rows:
        run_id = json.loads(payload)["key"]
        if run_exists(dag_id, run_id):
            continue
        reason = f"run {dag_id}/{run_id} was relayed but Airflow does not have it; re-queued for the relay"
        with ledger.engine.begin() as conn:
            item = items.lock_item(conn, work_key)
            if item is None or item["state"] != states.DONE:
                continue  # re-opened since: its next commit makes a new follow-up
            requeued = conn.execute(
                sa.update(o).where(o.c.id == row_id, o.c.state == "relayed").values(state="pending")
            ).rowcount
            if requeued:
                items.apply(conn, item, "repair_follow_up", states.RECONCILER, {"now": now, "reason": reason})
        if requeued:
            found.append(Finding("missing_run", work_key, reason, repaired=True))
    return found


def reconcile(
    ledger: Ledger,
    *,
    grace_seconds: float = 0.0,
    relay_stall_seconds: float = 600.0,
    sink: AirflowSink | None = None,
    run_exists: RunExists | None = None,
    extra_checks: Sequence[ExtraCheck] = (),
) -> ReconcileReport:
    """Run every check once and repair what can be repaired. Safe to run again at any time.

    Missing runs are re-queued before the relay check, so a sink delivers them in the same pass.
    """
    report = ReconcileReport()
    report.findings += expire_stale_leases(ledger, grace_seconds=grace_seconds)
    report.findings += repair_missing_follow_ups(ledger)
    if run_exists is not None:
        report.findings += requeue_missing_runs(ledger, run_exists)
    check_relay(ledger, report, relay_stall_seconds=relay_stall_seconds, sink=sink)
    for extra in extra_checks:
        report.findings += extra(ledger)
    return report
