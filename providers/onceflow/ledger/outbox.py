"""The outbox relay: delivers committed follow-ups (outbox rows) to Airflow.

A result and its follow-ups are written in one transaction (``commit.py``), so a follow-up can
be late but never missing. The relay takes pending rows one at a time, hands each to an
:class:`AirflowSink` and marks it relayed in the same transaction that locked it: relays running
side by side take disjoint rows (``SKIP LOCKED`` on PostgreSQL, the write lock on SQLite). A
crash after the sink call and before the mark repeats the delivery, so sinks must be
idempotent: DAG runs use a deterministic run id, which Airflow refuses to create twice.
Every pass records itself in ``relay_status`` so reconciliation can tell a stalled relay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from onceflow.ledger import items, schema
from onceflow.ledger.db import is_sqlite
from onceflow.ledger.models import ASSET_EVENT, DAG_RUN
from onceflow.ledger.queries import query

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger


class AirflowSink(Protocol):
    """The Airflow side of the relay (implemented in ``onceflow.hooks.ledger``)."""

    def trigger_dag_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> bool:
        """Create the run; ``True`` if created now, ``False`` if it already existed."""

    def emit_asset_event(self, uri: str, extra: dict[str, Any]) -> None:
        """Record one event for the asset ``uri``."""


@dataclass
class RelayReport:
    relayed: int = 0
    already_existed: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class OutboxRow:
    id: int
    dedup_key: str
    work_key: str
    step: str
    target_type: str
    target: str
    key: str
    data: dict[str, Any]


def _row(m: Any) -> OutboxRow:
    body = json.loads(m["payload"]) if m["payload"] else {}
    return OutboxRow(
        id=m["id"],
        dedup_key=m["dedup_key"],
        work_key=m["work_key"],
        step=m["step"],
        target_type=m["target_type"],
        target=m["target"],
        key=body.get("key", ""),
        data=body.get("data") or {},
    )


def deliver(sink: AirflowSink, row: OutboxRow) -> bool:
    """Hand one row to the sink; ``False`` when Airflow already had it."""
    if row.target_type == DAG_RUN:
        conf = {**row.data, "onceflow_work_key": row.work_key, "onceflow_step": row.step}
        return sink.trigger_dag_run(row.target, row.key, conf)
    if row.target_type == ASSET_EVENT:
        sink.emit_asset_event(row.target, {**row.data, "onceflow_dedup_key": row.dedup_key})
        return True
    raise ValueError(f"outbox row {row.id} has unknown target type {row.target_type!r}")


class OutboxRelay:
    """Relay pending outbox rows of ``ledger`` to ``sink``.

    :param name: identifies this relay in ``relay_status``.
    :param max_rows: stop a pass after this many rows.
    """

    def __init__(
        self, ledger: Ledger, sink: AirflowSink, *, name: str = "default", max_rows: int = 500
    ) -> None:
        self.ledger = ledger
        self.sink = sink
        self.name = name
        self.max_rows = max_rows

    def relay_once(self) -> RelayReport:
        """One pass over the pending rows (failed deliveries stay pending with their error)."""
        report = RelayReport()
        pick = query("outbox_pick_sqlite" if is_sqlite(self.ledger.engine) else "outbox_pick_postgresql")
        after_id = 0
        for _ in range(self.max_rows):
            with self.ledger.engine.begin() as conn:
                found = conn.execute(pick, {"after_id": after_id}).mappings().first()
                if found is None:
                    break
                row = _row(found)
                after_id = row.id
                try:
                    created = deliver(self.sink, row)
                except Exception as exc:  # recorded on the row; the next pass retries it
                    conn.execute(
                        query("outbox_mark_error"),
                        {"id": row.id, "error": f"{type(exc).__name__}: {exc}"[:4000]},
                    )
                    report.errors.append(f"{row.dedup_key}: {type(exc).__name__}: {exc}")
                    continue
                conn.execute(query("outbox_mark_relayed"), {"id": row.id, "now": self.ledger.clock.now()})
                report.relayed += 1
                report.already_existed += not created
        self._record_pass(report.relayed)
        return report

    def _record_pass(self, relayed: int) -> None:
        params = {"name": self.name, "now": self.ledger.clock.now(), "relayed": relayed}
        with self.ledger.engine.begin() as conn:
            if conn.execute(query("relay_status_update"), params).rowcount == 0:
                # Two relays of one name starting at once: the loser's insert is a no-op.
                items.insert_ignore(
                    conn,
                    schema.relay_status,
                    {"relay_name": self.name, "last_run_at": params["now"], "last_relayed": relayed},
                    "relay_name",
                )


def pending_rows(ledger: Ledger) -> list[OutboxRow]:
    """Every outbox row not yet relayed, oldest first."""
    o = schema.outbox
    with ledger.engine.connect() as conn:
        rows = conn.execute(o.select().where(o.c.state == "pending").order_by(o.c.id)).mappings().all()
    return [_row(m) for m in rows]
