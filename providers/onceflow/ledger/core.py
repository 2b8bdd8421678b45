"""``Ledger``: the small public API over the ledger modules.

::

    ledger = Ledger(create_ledger_engine("postgresql+psycopg2://127.0.0.1/ledger"))
    ledger.add("fetch", "article:42", payload={"url": "https://..."})
    lease = ledger.claim("fetch", owner="worker-1", lease_seconds=60, worker_version="v3")
    if lease:
        lease.heartbeat()                      # while working
        ledger.commit_result(lease, "fetch", {"bytes": 1234},
                             follow_ups=[FollowUp.work_item("translate", "article:42:translate")])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger import commit, items, keyed, leases, migrations, schema, states
from onceflow.ledger.clock import Clock, DatabaseClock, db_now, statement_now
from onceflow.ledger.db import prepare_engine
from onceflow.ledger.errors import IllegalTransition, UnknownWorkItem
from onceflow.ledger.models import FollowUp, Lease, ResultRecord, TransitionRecord, WorkItem

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sqlalchemy.engine import Connection, Engine


class Ledger:
    """The work ledger on one database.

    :param engine: SQLAlchemy engine (PostgreSQL or SQLite); SQLite engines are prepared so
        every transaction takes the write lock first (``BEGIN IMMEDIATE``).
    :param clock: time source. Default: the database's clock (:class:`DatabaseClock`), which lease
        statements read in the statement itself, so no worker's clock decides a lease. Tests
        inject ``onceflow.testing.clock.FakeClock``; its time then goes into every statement.
    :param migrate: bring the schema up to date on construction (idempotent, safe in parallel).
    """

    def __init__(self, engine: Engine, clock: Clock | None = None, *, migrate: bool = True) -> None:
        self.engine = prepare_engine(engine)
        self.clock: Clock = clock or DatabaseClock(self.engine)
        if migrate:
            migrations.migrate(self.engine)

    # -- producers ---------------------------------------------------------------------------
    def add(
        self,
        kind: str,
        work_key: str,
        *,
        payload: Any = None,
        priority: int = 0,
        available_at: float | None = None,
        required_version: str | None = None,
        max_attempts: int = 5,
        reason: str | None = None,
        actor: str = states.PRODUCER,
    ) -> bool:
        """Create a pending work item; ``False`` (and no change) when the key already exists."""
        with self.engine.begin() as conn:
            return items.create_item(
                conn,
                kind=kind,
                work_key=work_key,
                # on this connection: DatabaseClock.now() would check out a second one while this
                # transaction holds the first (a pool of one, or a full pool, would wait forever)
                now=db_now(conn, statement_now(self.clock)),
                actor=actor,
                priority=priority,
                payload=payload,
                available_at=available_at,
                required_version=required_version,
                max_attempts=max_attempts,
                reason=reason,
            )

    def add_many(self, kind: str, work_keys: Iterable[str], *, priority: int = 0, batch: int = 1000) -> int:
        """Create many pending items, ``batch`` per transaction (one multi-row insert each).

        :return: how many were new (existing keys are left unchanged).
        """
        from sqlalchemy.dialects import postgresql, sqlite

        states.check("create", None, states.PRODUCER, {"now": self.clock.now()})
        keys = list(work_keys)
        insert = sqlite.insert if self.engine.dialect.name == "sqlite" else postgresql.insert
        w = schema.work_items
        created = 0
        for start in range(0, len(keys), batch):
            now = self.clock.now()
            rows = [
                {"work_key": key, "kind": kind, "state": states.PENDING, "priority": priority, "available_at": now,
                 "fencing_token": 0, "attempts": 0, "max_attempts": 5, "created_at": now, "updated_at": now,
                 "lane": "new"}
                for key in keys[start : start + batch]
            ]  # fmt: skip
            with self.engine.begin() as conn:
                stmt = insert(w).on_conflict_do_nothing(index_elements=["work_key"]).returning(w.c.work_key)
                new_keys = list(conn.execute(stmt, rows).scalars())
                if new_keys:
                    conn.execute(
                        sa.insert(schema.transitions),
                        [
                            {"work_key": key, "event": "create", "from_state": None, "to_state": states.PENDING,
                             "actor": states.PRODUCER, "owner": None, "fencing_token": 0, "at": now, "reason": None}
                            for key in new_keys
                        ],
                    )  # fmt: skip
            created += len(new_keys)
        return created

    # -- workers -----------------------------------------------------------------------------
    def claim(
        self, kind: str, owner: str, lease_seconds: float, worker_version: str, *, lane: str = "new"
    ) -> Lease | None:
        """Lease the next eligible item of ``kind`` (fencing token + 1), or ``None``.

        :param lane: ``"new"`` for normal work, ``"recheck"`` for items re-opened by a recheck.
        """
        found = self.claim_many(kind, owner, lease_seconds, worker_version, limit=1, lane=lane)
        return found[0] if found else None

    def claim_many(
        self,
        kind: str,
        owner: str,
        lease_seconds: float,
        worker_version: str,
        *,
        limit: int,
        lane: str = "new",
    ) -> list[Lease]:
        """Lease up to ``limit`` eligible items in one round trip (PostgreSQL), best first.

        Each lease has its own fencing token and ``claim`` transition, exactly as ``limit``
        single claims would; ``[]`` when nothing is eligible. Every lease starts now, so a
        worker that handles them one after another heartbeats the waiting ones (or asks for
        no more than it finishes within one lease).
        """
        found = leases.claim(
            self.engine,
            kind=kind,
            owner=owner,
            lease_seconds=lease_seconds,
            worker_version=worker_version,
            now=statement_now(self.clock),
            lane=lane,
            limit=limit,
        )
        for lease in found:
            lease._ledger = self
        return found

    def lease_key(
        self,
        kind: str,
        work_key: str,
        owner: str,
        lease_seconds: float,
        worker_version: str,
        *,
        reopen_reason: str,
        payload: Any = None,
    ) -> Lease:
        """Lease the named item, creating it or re-opening it (``recheck``) when it finished.

        :raises LeaseHeld: another owner's lease is current.
        """
        lease = keyed.lease_key(
            self.engine,
            kind=kind,
            work_key=work_key,
            owner=owner,
            lease_seconds=lease_seconds,
            worker_version=worker_version,
            now=statement_now(self.clock),
            payload=payload,
            reopen_reason=reopen_reason,
        )
        lease._ledger = self
        return lease

    def record_result(
        self, work_key: str, step: str, processing_version: str, token: int, payload: Any, *, reason: str
    ) -> bool:
        """Reconciler: record a result a sink committed under ``token``; ``False`` if nothing to do."""
        return keyed.record_result(
            self.engine,
            work_key=work_key,
            step=step,
            processing_version=processing_version,
            token=token,
            payload=payload,
            now=statement_now(self.clock),
            reason=reason,
        )

    def heartbeat(self, lease: Lease, lease_seconds: float | None = None) -> Lease:
        """Extend ``lease``; raises ``StaleFenceError`` when a newer lease exists."""
        return leases.heartbeat(
            self.engine, lease, now=statement_now(self.clock), lease_seconds=lease_seconds
        )

    def release(self, lease: Lease, reason: str = "released") -> bool:
        """Give the item back untouched; ``False`` if the lease was already lost."""
        return leases.release(self.engine, lease, now=statement_now(self.clock), reason=reason)

    def commit_result(
        self,
        lease: Lease,
        step: str,
        payload: Any,
        follow_ups: Sequence[FollowUp] = (),
        *,
        complete: bool = True,
        reason: str | None = None,
    ) -> ResultRecord:
        """Commit ``payload`` as the result of ``step`` plus its follow-ups, fenced by the lease."""
        return commit.commit_result(
            self.engine,
            lease,
            step=step,
            payload=payload,
            follow_ups=follow_ups,
            now=self.clock.now(),
            complete=complete,
            reason=reason,
        )

    def record_refusal(self, lease: Lease, what: str) -> bool:
        """Record a sink's refusal of ``lease``'s write as ``commit_refused`` (only if stale)."""
        return commit.record_refusal(self.engine, lease, now=self.clock.now(), what=what)

    def fail(self, lease: Lease, error: BaseException | str, *, backoff_seconds: float | None = None) -> str:
        """Transient failure: retry later or give up after ``max_attempts``; returns the new state."""
        return commit.fail(
            self.engine, lease, error=error, now=self.clock.now(), backoff_seconds=backoff_seconds
        )

    def mark_invalid(
        self, lease: Lease, reason: str, *, step: str = "", follow_ups: Sequence[FollowUp] = ()
    ) -> None:
        """Permanent input problem: ``needs_correction`` with ``reason``, and ``follow_ups`` (of
        ``step``) in the same transaction."""
        commit.mark_invalid(
            self.engine, lease, reason=reason, now=self.clock.now(), step=step, follow_ups=follow_ups
        )

    def enqueue(self, step: str, follow_ups: Sequence[tuple[str, FollowUp]], actor: str = "producer") -> int:
        """Write keyed outbox follow-ups that no lease commits, as (work key, follow-up) pairs (a
        sheet row a claim found INVALID or DUPLICATE, a row ``sheet_reconcile`` finishes), in one
        transaction; return how many were new. A repeat is the same outbox row.

        :raises ValueError: a follow-up without a key, or not for the outbox.
        """
        return commit.enqueue(
            self.engine, step=step, follow_ups=follow_ups, now=self.clock.now(), actor=actor
        )

    # -- operators and the reconciler --------------------------------------------------------
    def transition(self, work_key: str, event: str, actor: str, reason: str | None = None) -> WorkItem:
        """Apply a table event that needs no lease (``correct``, ``cancel``, ``expire``, ...).

        :raises IllegalTransition: not allowed now; nothing changed.
        """
        with self.engine.begin() as conn:
            item = items.lock_item(conn, work_key)
            # After the lock, so "has this lease expired" is judged on the row as it is now.
            now = db_now(conn, statement_now(self.clock))
            updates: dict[str, Any] = {}
            if event in ("correct", "expire", "recheck"):
                updates = {"available_at": now, "lease_expires_at": None}
            if event in ("correct", "recheck"):
                updates["attempts"] = 0
            if event == "give_up_expired":
                updates = {"lease_expires_at": None, "last_error_class": "LeaseExpired", "last_error": reason}
            if event in states.LEASE_EVENTS:
                state = None if item is None else item["state"]
                raise IllegalTransition(
                    work_key, event, state, actor, "needs a lease (claim, then commit/fail)"
                )
            if item is None:
                states.check(event, None, actor, {"now": now, "reason": reason}, work_key)
                raise UnknownWorkItem(work_key)
            items.apply(conn, item, event, actor, {"now": now, "reason": reason}, updates)
        return self.item(work_key)

    # -- reading -----------------------------------------------------------------------------
    def item(self, work_key: str) -> WorkItem:
        """The work item ``work_key``; raises ``UnknownWorkItem`` when there is none."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(schema.work_items).where(schema.work_items.c.work_key == work_key)
            ).first()
        if row is None:
            raise UnknownWorkItem(work_key)
        return WorkItem.from_row(row)

    def history(self, work_key: str) -> list[TransitionRecord]:
        """Every recorded transition of one item, oldest first."""
        t = schema.transitions
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t).where(t.c.work_key == work_key).order_by(t.c.id)).mappings()
            return [TransitionRecord(**{k: v for k, v in r.items() if k != "id"}) for r in rows]

    def results(self, work_key: str) -> list[ResultRecord]:
        """Every committed result of ``work_key``, oldest first."""
        with self.engine.connect() as conn:
            return read_results(conn, work_key)

    def counts(self, kind: str | None = None) -> dict[str, int]:
        """Number of items per state (optionally of one kind)."""
        w = schema.work_items
        stmt = sa.select(w.c.state, sa.func.count()).group_by(w.c.state)
        if kind is not None:
            stmt = stmt.where(w.c.kind == kind)
        with self.engine.connect() as conn:
            return {state: int(n) for state, n in conn.execute(stmt)}


def read_results(conn: Connection, work_key: str) -> list[ResultRecord]:
    """Every committed result of ``work_key``, oldest first: one query on the results' unique index.

    :meth:`Ledger.results` on the ledger's own engine; outside a worker, on any connection, e.g. a
    read-only engine that takes no SQLite write lock (``onceflow.run_notes``, in the scheduler).
    """
    r = schema.results
    rows = conn.execute(sa.select(r).where(r.c.work_key == work_key).order_by(r.c.id)).mappings().all()
    return [ResultRecord.from_row(m) for m in rows]
