"""The outbox relay: delivers committed follow-ups (outbox rows) to Airflow, at least once.

A result and its follow-ups are written in one transaction (``commit.py``), so a follow-up can
be late but never missing. A row is marked relayed only once its delivery is durable in Airflow:

* a DAG run is durable when the sink returns (the Execution API or the ORM created it, or it
  already existed): the row is marked at once;
* an Asset event handed to a running task's outlet (:class:`~onceflow.hooks.ledger.TaskSdkSink`)
  is durable only when that task succeeds: the row stays ``pending`` and its id is returned in
  :attr:`RelayReport.awaiting`; the task confirms it after Airflow recorded the success
  (:func:`confirm_relayed`, the relay operators' success callback).

A crash between delivery and marking (or a second relay running at that moment) repeats the
delivery, so deliveries are idempotent or deduplicated downstream: DAG runs use a deterministic
run id, which Airflow refuses to create twice; every Asset event carries its outbox key as
``extra["onceflow_dedup_key"]``, the event id consumers deduplicate by (:func:`unique_events`).

The sink is never called inside a SQLite transaction: SQLite's write lock covers the whole
database, and a slow sink would stall every claim and commit. Each row is picked in one short
transaction and marked in another. On PostgreSQL the row stays locked (``SKIP LOCKED``) in its
own transaction while it is delivered, which blocks nothing else and keeps relays running side
by side on disjoint rows. Every pass records itself in ``relay_status`` so reconciliation can
tell a stalled relay.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import sqlalchemy as sa

from onceflow.ledger import items, schema
from onceflow.ledger.clock import db_now, statement_now
from onceflow.ledger.db import is_sqlite
from onceflow.ledger.models import ASSET_EVENT, DAG_RUN
from onceflow.ledger.queries import query

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from onceflow.ledger.core import Ledger

EVENT_ID_KEY = "onceflow_dedup_key"
"""Key of an Asset event's ``extra`` that holds its outbox id (consumers deduplicate by it)."""

T = TypeVar("T")


class AirflowSink(Protocol):
    """The Airflow side of the relay (implemented in ``onceflow.hooks.ledger``)."""

    def trigger_dag_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> bool:
        """Create the run; ``True`` if created now, ``False`` if it already existed."""

    def emit_asset_event(self, uri: str, extra: dict[str, Any]) -> bool:
        """Record one event for the asset ``uri``.

        :return: ``True`` when the event is recorded now; ``False`` when Airflow records it only
            when the running task succeeds (the row then waits for :func:`confirm_relayed`).
        """


@dataclass
class RelayReport:
    """One pass: rows delivered, runs Airflow already had, errors, and the ids of rows whose
    delivery becomes durable only when the running task succeeds (confirm them then)."""

    relayed: int = 0
    already_existed: int = 0
    errors: list[str] = field(default_factory=list)
    awaiting: list[int] = field(default_factory=list)


@dataclass
class OutboxRow:
    """A row of the outbox: one promised follow-up (a DAG run or an Asset event) and its delivery state."""

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


def deliver(sink: AirflowSink, row: OutboxRow) -> tuple[bool, bool]:
    """Hand one row to the sink: ``(created, durable)``; ``created`` is ``False`` when Airflow
    already had the run, ``durable`` is ``False`` when the task's success still has to record it."""
    if row.target_type == DAG_RUN:
        conf = {**row.data, "onceflow_work_key": row.work_key, "onceflow_step": row.step}
        return sink.trigger_dag_run(row.target, row.key, conf), True
    if row.target_type == ASSET_EVENT:
        durable = sink.emit_asset_event(row.target, {**row.data, EVENT_ID_KEY: row.dedup_key})
        return True, bool(durable)
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
        after_id = 0
        for _ in range(self.max_rows):
            if is_sqlite(self.ledger.engine):
                with self.ledger.engine.begin() as conn:
                    row = _pick(conn, "outbox_pick_sqlite", after_id)
                if row is None:
                    break
                outcome = self._deliver(row)  # outside the write lock: claims go on meanwhile
                with self.ledger.engine.begin() as conn:
                    self._record(conn, row, outcome, report)
            else:
                with self.ledger.engine.begin() as conn:
                    row = _pick(conn, "outbox_pick_postgresql", after_id)
                    if row is None:
                        break
                    outcome = self._deliver(row)  # only this outbox row is locked
                    self._record(conn, row, outcome, report)
            after_id = row.id
        self._record_pass(report.relayed)
        return report

    def _deliver(self, row: OutboxRow) -> tuple[bool, bool] | Exception:
        try:
            return deliver(self.sink, row)
        except Exception as exc:  # recorded on the row; the next pass retries it
            return exc

    def _record(
        self, conn: Connection, row: OutboxRow, outcome: tuple[bool, bool] | Exception, report: RelayReport
    ) -> None:
        # On this transaction's connection: DatabaseClock.now() would check out a second one
        # while this transaction holds the first (a pool of one would wait forever).
        now = db_now(conn, statement_now(self.ledger.clock))
        if isinstance(outcome, Exception):
            error = f"{type(outcome).__name__}: {outcome}"
            conn.execute(query("outbox_mark_error"), {"id": row.id, "error": error[:4000]})
            report.errors.append(f"{row.dedup_key}: {error}")
            return
        created, durable = outcome
        if durable:
            conn.execute(query("outbox_mark_relayed"), {"id": row.id, "now": now})
        else:  # stays pending until the task's success makes it durable
            conn.execute(query("outbox_mark_handed"), {"id": row.id})
            report.awaiting.append(row.id)
        report.relayed += 1
        report.already_existed += not created

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


def _pick(conn: Connection, name: str, after_id: int) -> OutboxRow | None:
    found = conn.execute(query(name), {"after_id": after_id}).mappings().first()
    return None if found is None else _row(found)


def confirm_relayed(ledger: Ledger, row_ids: Sequence[int]) -> int:
    """Mark rows relayed whose delivery Airflow has now made durable (the relaying task succeeded).

    :return: how many were still pending (a row another relay marked meanwhile is left alone).
    """
    if not row_ids:
        return 0
    stmt = query("outbox_confirm").bindparams(sa.bindparam("ids", expanding=True))
    with ledger.engine.begin() as conn:
        now = db_now(conn, statement_now(ledger.clock))  # this connection's clock, see _record
        return int(conn.execute(stmt, {"ids": list(row_ids), "now": now}).rowcount)


def rows_by_id(ledger: Ledger, row_ids: Sequence[int]) -> list[OutboxRow]:
    """The outbox rows with these ids (any state), oldest first."""
    if not row_ids:
        return []
    o = schema.outbox
    with ledger.engine.connect() as conn:
        rows = conn.execute(o.select().where(o.c.id.in_(list(row_ids))).order_by(o.c.id)).mappings().all()
    return [_row(m) for m in rows]


def unique_events(events: Iterable[T], extra: Callable[[T], Mapping[str, Any] | None]) -> list[T]:
    """Keep the first of each outbox event id (``extra["onceflow_dedup_key"]``): a consumer's
    deduplication of an at-least-once delivery. Events without the key are all kept.

    :param extra: how to get an event's extra (e.g. ``lambda e: e.extra`` for Airflow's events).
    """
    seen: set[str] = set()
    kept = []
    for event in events:
        event_id = (extra(event) or {}).get(EVENT_ID_KEY)
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        kept.append(event)
    return kept


def pending_rows(ledger: Ledger) -> list[OutboxRow]:
    """Every outbox row not yet relayed, oldest first."""
    o = schema.outbox
    with ledger.engine.connect() as conn:
        rows = conn.execute(o.select().where(o.c.state == "pending").order_by(o.c.id)).mappings().all()
    return [_row(m) for m in rows]


def pending_sheet_rows(ledger: Ledger, target: str | None = None, limit: int = 200) -> list[OutboxRow]:
    """Pending ``sheet_row`` follow-ups (of one sheet, ``<spreadsheet id>/<tab>``, or all), oldest
    first: the rows :mod:`onceflow.sheets.relay` writes (Airflow's relay leaves them alone)."""
    with ledger.engine.connect() as conn:
        found = conn.execute(query("outbox_sheet_rows_pending"), {"target": target, "limit": limit})
        return [_row(m) for m in found.mappings().all()]


def count_pending_sheet_rows(engine: Engine, target: str) -> int:
    """How many ``sheet_row`` follow-ups of ``target`` wait to be written: one query, no Sheets
    request (``sheet_claim``'s sensor asks it before reading the sheet)."""
    with engine.connect() as conn:
        return int(conn.execute(query("outbox_sheet_rows_waiting"), {"target": target}).scalar() or 0)


def mark_relayed(ledger: Ledger, row_ids: Sequence[int]) -> int:
    """Mark these rows relayed (only those still pending); return how many it marked."""
    marked = 0
    with ledger.engine.begin() as conn:
        now = db_now(conn, statement_now(ledger.clock))  # this connection's clock, see _record
        for row_id in row_ids:
            marked += int(conn.execute(query("outbox_mark_relayed"), {"id": row_id, "now": now}).rowcount)
    return marked


def mark_failed_delivery(ledger: Ledger, row_ids: Sequence[int], error: str) -> None:
    """Record a failed delivery on these rows; they stay pending for the next pass."""
    with ledger.engine.begin() as conn:
        for row_id in row_ids:
            conn.execute(query("outbox_mark_error"), {"id": row_id, "error": error[:4000]})
