"""Property-based tests of the ledger's state model (hypothesis ``RuleBasedStateMachine``).

Workers claim, heartbeat, commit, fail, release and crash; late workers act on leases that were
taken over; time jumps past lease expiries; the reconciler and rechecks run; operators try
arbitrary events. A plain-Python model predicts every outcome (which item a claim returns, which
writes are fenced off), and after every step the database must agree with the model and satisfy
the invariants: only table-allowed transitions were recorded, tokens grow by one per grant, a
done item holds the result of its final lease, no item is ever granted more attempts than its
budget (a poison item whose last attempt's lease expired is given up, not retried), and an
illegal operation changed nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from onceflow.ledger import IllegalTransition, Ledger, StaleFenceError, create_ledger_engine, states
from onceflow.ledger.recheck import RecheckRequest, start_recheck
from onceflow.ledger.reconcile import reconcile
from onceflow.testing.clock import FakeClock

KEYS = ["k0", "k1", "k2", "k3"]
WORKERS = [("w0", "v1"), ("w1", "v1"), ("w2", "v2")]
MAX_ATTEMPTS = 2
BACKOFF = 5.0
STEP = "s"


@dataclass
class Model:
    order: int
    required_version: str | None
    available_at: float
    state: str = states.PENDING
    token: int = 0
    lease_expires_at: float | None = None
    attempts: int = 0
    lane: str = "new"
    result_tokens: dict[str, int] = field(default_factory=dict)


class LedgerMachine(RuleBasedStateMachine):
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        if self.backend == "sqlite":
            self.tmp = tempfile.mkdtemp(prefix="ledger-hyp-")
            self.url = f"sqlite:///{os.path.join(self.tmp, 'ledger.db')}"
        else:
            from onceflow.testing import postgres

            self.url = postgres.create_database("ledger_hyp")
        self.clock = FakeClock()
        self.engine = create_ledger_engine(self.url)
        self.ledger = Ledger(self.engine, clock=self.clock)
        self.model: dict[str, Model] = {}
        self.leases: list = []
        self.gave_up: set[str] = set()  # keys the model expects a give_up_expired for

    def teardown(self) -> None:
        self.engine.dispose()
        if self.backend == "sqlite":
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            from onceflow.testing import postgres

            postgres.drop_database(self.url)

    # -- helpers -----------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def current(self, lease) -> bool:
        m = self.model[lease.work_key]
        return m.state == states.LEASED and m.token == lease.token

    def snapshot(self):
        with self.engine.connect() as conn:
            return [
                sorted(tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {t}")))
                for t in ("work_items", "transitions", "results")
            ]

    # -- producers and time ------------------------------------------------------------------
    @initialize(key=st.sampled_from(KEYS))
    def first_item(self, key):
        self.add(key, None)

    @rule(key=st.sampled_from(KEYS), version=st.sampled_from([None, "v2"]))
    def add(self, key, version):
        created = self.ledger.add("work", key, required_version=version, max_attempts=MAX_ATTEMPTS)
        assert created == (key not in self.model)
        if created:
            self.model[key] = Model(order=len(self.model), required_version=version, available_at=self.now())

    @rule(seconds=st.sampled_from([1.0, 5.0, 11.0, 31.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    # -- workers -----------------------------------------------------------------------------
    @rule(worker=st.sampled_from(WORKERS), lane=st.sampled_from(["new", "recheck"]),
          lease_seconds=st.sampled_from([10.0, 30.0]))  # fmt: skip
    def claim(self, worker, lane, lease_seconds):
        owner, version = worker
        now = self.now()
        eligible = [
            (m.available_at, m.order, key)
            for key, m in self.model.items()
            if m.lane == lane
            and m.required_version in (None, version)
            and (
                (m.state == states.PENDING and m.available_at <= now)
                or (m.state == states.LEASED and m.lease_expires_at <= now)
            )
        ]
        lease = self.ledger.claim("work", owner, lease_seconds, version, lane=lane)
        # Best first; an expired lease on the last attempt is given up on the way, not taken over.
        expected = None
        for _, _, key in sorted(eligible):
            m = self.model[key]
            if m.state == states.LEASED and m.attempts >= MAX_ATTEMPTS:
                m.state, m.lease_expires_at = states.FAILED, None
                self.gave_up.add(key)
                continue
            expected = key
            break
        if expected is None:
            assert lease is None
            return
        assert lease is not None and lease.work_key == expected
        m = self.model[expected]
        m.state, m.token, m.attempts = states.LEASED, m.token + 1, m.attempts + 1
        m.lease_expires_at = now + lease_seconds
        assert lease.token == m.token
        self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(min_value=0, max_value=50))
    def heartbeat(self, i):
        lease = self.leases[i % len(self.leases)]
        if self.current(lease):
            lease.heartbeat()
            self.model[lease.work_key].lease_expires_at = self.now() + lease.lease_seconds
        else:
            with pytest.raises(StaleFenceError):
                lease.heartbeat()

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(min_value=0, max_value=50))
    def commit(self, i):
        lease = self.leases[i % len(self.leases)]
        m = self.model[lease.work_key]
        if self.current(lease):
            result = self.ledger.commit_result(lease, STEP, {"token": lease.token})
            assert result.fencing_token == lease.token
            m.state, m.lease_expires_at = states.DONE, None
            m.result_tokens[lease.worker_version] = lease.token
            m.required_version = None  # met (the claim checked it): the pin ends with the item's completion
        elif m.result_tokens.get(lease.worker_version) == lease.token:
            before = self.snapshot()
            assert self.ledger.commit_result(lease, STEP, {"token": lease.token}).fencing_token == lease.token
            assert self.snapshot() == before  # the repeat of a successful commit is a no-op
        else:
            with pytest.raises(StaleFenceError):
                self.ledger.commit_result(lease, STEP, {"token": lease.token})
            last = self.ledger.history(lease.work_key)[-1]
            assert (last.event, last.fencing_token) == ("commit_refused", lease.token)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(min_value=0, max_value=50))
    def fail(self, i):
        lease = self.leases[i % len(self.leases)]
        m = self.model[lease.work_key]
        if not self.current(lease):
            with pytest.raises(StaleFenceError):
                self.ledger.fail(lease, "Flaky", backoff_seconds=BACKOFF)
            return
        new_state = self.ledger.fail(lease, "Flaky", backoff_seconds=BACKOFF)
        m.lease_expires_at = None
        if m.attempts < MAX_ATTEMPTS:
            assert new_state == states.PENDING
            m.state, m.available_at = states.PENDING, self.now() + BACKOFF
        else:
            assert new_state == m.state == states.FAILED or new_state == states.FAILED
            m.state = states.FAILED

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(min_value=0, max_value=50))
    def invalid_input(self, i):
        lease = self.leases[i % len(self.leases)]
        if not self.current(lease):
            with pytest.raises(StaleFenceError):
                self.ledger.mark_invalid(lease, "bad url")
            return
        self.ledger.mark_invalid(lease, "bad url")
        m = self.model[lease.work_key]
        m.state, m.lease_expires_at = states.NEEDS_CORRECTION, None

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(min_value=0, max_value=50))
    def release(self, i):
        lease = self.leases[i % len(self.leases)]
        expected = self.current(lease)
        assert lease.release("shutdown") is expected
        if expected:
            m = self.model[lease.work_key]
            m.state, m.available_at, m.lease_expires_at = states.PENDING, self.now(), None
            m.attempts = max(m.attempts - 1, 0)

    @rule(worker=st.sampled_from(WORKERS), lane=st.sampled_from(["new", "recheck"]))
    def claim_then_crash(self, worker, lane):
        """A poison item: whoever claims it dies, and its lease runs out."""
        self.claim(worker, lane, 10.0)
        self.crash(worker[0])
        self.clock.advance(11.0)

    @rule(worker=st.sampled_from([w for w, _ in WORKERS]))
    def crash(self, worker):
        """The worker dies holding its leases: nothing is released, they can only expire."""
        self.leases = [lease for lease in self.leases if lease.owner != worker]

    # -- reconciler, rechecks, operators ---------------------------------------------------------
    @rule()
    def reconcile(self):
        now = self.now()
        expired = {k for k, m in self.model.items() if m.state == states.LEASED and m.lease_expires_at <= now}
        report = reconcile(self.ledger)
        assert {f.work_key for f in report.findings} == expired
        for key in expired:
            m = self.model[key]
            if m.attempts >= MAX_ATTEMPTS:  # the last attempt died: give up, do not retry
                m.state, m.lease_expires_at = states.FAILED, None
                self.gave_up.add(key)
            else:
                m.state, m.available_at, m.lease_expires_at = states.PENDING, now, None

    @rule()
    def recheck(self):
        done = {k for k, m in self.model.items() if m.state == states.DONE}
        result = start_recheck(
            self.ledger, RecheckRequest(scope="quality_sample", reason="sample", kind="work", max_items=100)
        )
        assert set(result.work_keys) == done
        for key in done:
            m = self.model[key]
            m.state, m.available_at, m.lane, m.attempts = states.PENDING, self.now(), "recheck", 0

    @rule(
        key=st.sampled_from(KEYS),
        event=st.sampled_from(
            [
                "correct",
                "cancel",
                "expire",
                "give_up_expired",
                "recheck",
                "abandon",
                "complete",
                "claim",
                "give_up",
                "nope",
            ]
        ),
        actor=st.sampled_from(sorted(states.ACTORS)),
        reason=st.sampled_from([None, "because"]),
    )
    def operator_event(self, key, event, actor, reason):
        if key not in self.model:
            return
        before = self.snapshot()
        m = self.model[key]
        try:
            self.ledger.transition(key, event, actor, reason=reason)
        except IllegalTransition:
            assert self.snapshot() == before
            return
        row = states.BY_EVENT[event]
        assert event not in states.LEASE_EVENTS and actor in row.actors and m.state in row.sources
        if event == "expire":
            assert m.lease_expires_at <= self.now() and m.attempts < MAX_ATTEMPTS
        if event == "give_up_expired":
            assert m.lease_expires_at <= self.now() and m.attempts >= MAX_ATTEMPTS and reason
            m.lease_expires_at = None
            self.gave_up.add(key)
        if row.target is not None:
            m.state = row.target
        if event in ("correct", "expire", "recheck"):
            m.available_at, m.lease_expires_at = self.now(), None
        if event in ("correct", "recheck"):
            m.attempts = 0

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def database_agrees_with_the_model_and_the_table(self):
        with self.engine.connect() as conn:
            items = {r.work_key: r for r in conn.execute(sa.text("SELECT * FROM work_items"))}
            transitions = conn.execute(
                sa.text(
                    "SELECT work_key, event, from_state, to_state, actor, fencing_token FROM transitions ORDER BY id"
                )
            ).all()
            results = conn.execute(sa.text("SELECT work_key, fencing_token FROM results")).all()
        assert set(items) == set(self.model)
        for key, m in self.model.items():
            row = items[key]
            assert row.state in states.STATES
            got = (row.state, row.fencing_token, row.attempts, row.lane, row.available_at)
            assert got == (m.state, m.token, m.attempts, m.lane, m.available_at), key
            assert row.required_version == m.required_version, key
            assert (row.lease_expires_at is not None) == (row.state == states.LEASED)
            if row.state == states.LEASED:
                assert row.lease_expires_at == m.lease_expires_at
        assert [
            t for t in transitions if not states.allowed(t.event, t.from_state, t.to_state, t.actor)
        ] == []
        for key in self.model:
            grants = [
                t.fencing_token
                for t in transitions
                if t.work_key == key and t.event in ("claim", "reclaim_expired")
            ]
            assert grants == list(range(1, items[key].fencing_token + 1))
        for key, token in results:
            assert token <= items[key].fencing_token
        for key, row in items.items():
            if row.state == states.DONE:
                assert (key, row.fencing_token) in set(results)

    @invariant()
    def no_item_gets_more_attempts_than_its_budget(self):
        """A worker that crashes on an item every time must not get it forever (a poison item)."""
        with self.engine.connect() as conn:
            over = conn.execute(
                sa.text("SELECT work_key FROM work_items WHERE attempts > max_attempts")
            ).all()
            gave_up = conn.execute(
                sa.text(
                    "SELECT t.work_key, t.reason, w.state, w.attempts FROM transitions t"
                    " JOIN work_items w ON w.work_key = t.work_key WHERE t.event = 'give_up_expired'"
                )
            ).all()
        assert over == []
        assert {key for key, *_ in gave_up} == self.gave_up
        assert all(reason for _, reason, _, _ in gave_up)  # the reason is recorded with it


LedgerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestLedgerStateMachineSQLite = LedgerMachine.TestCase


class PostgresLedgerMachine(LedgerMachine):
    backend = "postgresql"


PostgresLedgerMachine.TestCase.settings = settings(
    max_examples=12, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.postgres
def test_ledger_state_machine_on_postgresql(postgres_url_factory):
    postgres_url_factory("probe")  # skips (or fails in CI) without a server
    PostgresLedgerMachine.TestCase().runTest()
