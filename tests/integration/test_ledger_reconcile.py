"""Reconciliation and the outbox relay (relay against a recording sink; the Airflow sinks are
tested against the real metadata DB in test_ledger_airflow.py)."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from onceflow.ledger import FollowUp
from onceflow.ledger.outbox import OutboxRelay, confirm_relayed, pending_rows, unique_events
from onceflow.ledger.recheck import RecheckRequest, start_recheck
from onceflow.ledger.reconcile import reconcile


class RecordingSink:
    """An AirflowSink that remembers what it was asked; run ids are unique like Airflow's."""

    def __init__(self, fail: bool = False, durable_events: bool = True):
        self.runs: dict[tuple[str, str], dict] = {}
        self.events: list[tuple[str, dict]] = []
        self.fail = fail
        self.durable_events = durable_events

    def trigger_dag_run(self, dag_id, run_id, conf):
        if self.fail:
            raise ConnectionError("api-server down")
        if (dag_id, run_id) in self.runs:
            return False
        self.runs[(dag_id, run_id)] = conf
        return True

    def emit_asset_event(self, uri, extra):
        if self.fail:
            raise ConnectionError("api-server down")
        self.events.append((uri, extra))
        return self.durable_events


def commit_one(ledger, key, follow_ups):
    ledger.add("fetch", key)
    lease = ledger.claim("fetch", "w", 30, "v1")
    ledger.commit_result(lease, "fetch", {}, follow_ups=follow_ups)


def test_the_relay_delivers_each_outbox_row_once(ledger):
    commit_one(
        ledger, "a:1", [FollowUp.dag_run("article_pipeline", {"x": 1}), FollowUp.asset_event("file:///a")]
    )
    sink = RecordingSink()
    report = OutboxRelay(ledger, sink).relay_once()
    assert report.relayed == 2 and report.errors == []
    (((dag_id, run_id), conf),) = sink.runs.items()
    assert dag_id == "article_pipeline" and run_id.startswith("onceflow__a:1__fetch__v1")
    assert conf == {"x": 1, "onceflow_work_key": "a:1", "onceflow_step": "fetch"}
    assert sink.events[0][0] == "file:///a"
    assert OutboxRelay(ledger, sink).relay_once().relayed == 0
    assert pending_rows(ledger) == []


def test_a_failed_delivery_stays_pending_with_its_error(ledger):
    commit_one(ledger, "a:1", [FollowUp.dag_run("d")])
    report = OutboxRelay(ledger, RecordingSink(fail=True)).relay_once()
    assert report.relayed == 0 and "ConnectionError" in report.errors[0]
    with ledger.engine.connect() as conn:
        row = conn.execute(sa.text("SELECT state, attempts, last_error FROM outbox")).one()
    assert row[0] == "pending" and row[1] == 1 and "api-server down" in row[2]
    assert OutboxRelay(ledger, RecordingSink()).relay_once().relayed == 1


def test_reconcile_returns_expired_leases_to_pending_once(ledger, fake_clock):
    ledger.add("fetch", "a:1")
    ledger.add("fetch", "a:2")
    ledger.claim("fetch", "w1", 30, "v1")
    live = ledger.claim("fetch", "w2", 300, "v1")
    fake_clock.advance(60)
    report = reconcile(ledger)
    assert [f.work_key for f in report.findings] == ["a:1"]
    assert ledger.item("a:1").state == "pending" and ledger.item(live.work_key).state == "leased"
    expire = ledger.history("a:1")[-1]
    assert expire.event == "expire" and expire.actor == "reconciler" and "w1" in expire.reason
    assert reconcile(ledger).findings == []


def test_reconcile_recreates_a_missing_follow_up_and_records_it(ledger):
    commit_one(ledger, "a:1", [FollowUp.dag_run("d"), FollowUp.work_item("translate", "a:1:tr")])
    with ledger.engine.begin() as conn:  # someone "cleaned up" by hand
        conn.execute(sa.text("DELETE FROM outbox"))
        conn.execute(sa.text("DELETE FROM work_items WHERE work_key = 'a:1:tr'"))
    report = reconcile(ledger)
    assert report.count("missing_follow_up", repaired=True) == 2
    assert [r.target for r in pending_rows(ledger)] == ["d"]
    assert ledger.item("a:1:tr").state == "pending"
    repairs = [t for t in ledger.history("a:1") if t.event == "repair_follow_up"]
    assert len(repairs) == 2 and {t.actor for t in repairs} == {"reconciler"}
    assert reconcile(ledger).findings == []


def test_reconcile_flags_a_stalled_relay_and_repairs_it_with_a_sink(ledger, fake_clock):
    commit_one(ledger, "a:1", [FollowUp.dag_run("d")])
    fake_clock.advance(60)
    assert reconcile(ledger, relay_stall_seconds=600).relay_stalled is False
    fake_clock.advance(600)
    report = reconcile(ledger, relay_stall_seconds=600)
    assert report.relay_stalled and report.count("stalled_relay", repaired=False) == 1
    sink = RecordingSink()
    report = reconcile(ledger, relay_stall_seconds=600, sink=sink)
    assert report.count("stalled_relay", repaired=True) == 1 and len(sink.runs) == 1
    assert ledger.history("a:1")[-1].event == "repair_follow_up"
    assert reconcile(ledger, relay_stall_seconds=600, sink=sink).findings == []


def test_reconcile_requeues_a_relayed_run_that_airflow_does_not_have(ledger, fake_clock):
    commit_one(ledger, "a:1", [FollowUp.dag_run("d")])
    sink = RecordingSink()
    OutboxRelay(ledger, sink).relay_once()
    (run_key,) = sink.runs
    fake_clock.advance(301)

    def run_exists(dag_id, run_id):
        return (dag_id, run_id) in sink.runs

    assert reconcile(ledger, run_exists=run_exists).findings == []
    del sink.runs[run_key]  # someone deleted the run in Airflow
    report = reconcile(ledger, run_exists=run_exists)
    assert report.count("missing_run", repaired=True) == 1
    assert [r.key for r in pending_rows(ledger)] == [run_key[1]]
    assert ledger.history("a:1")[-1].event == "repair_follow_up"
    assert OutboxRelay(ledger, sink).relay_once().relayed == 1 and run_key in sink.runs
    fake_clock.advance(301)
    assert reconcile(ledger, run_exists=run_exists).findings == []


def test_a_recheck_at_the_same_version_relays_its_own_follow_ups_once(ledger, fake_clock):
    """Issue 11 defect 5: follow-ups are keyed by the attempt (fencing token), not key + step +
    version, so a recheck's result brings its own run and event; a retried commit adds nothing."""
    follow_ups = [FollowUp.dag_run("article_pipeline", {"x": 1}), FollowUp.asset_event("file:///a")]
    commit_one(ledger, "a:1", follow_ups)
    sink = RecordingSink()
    assert OutboxRelay(ledger, sink).relay_once().relayed == 2

    fake_clock.advance(60)
    start_recheck(ledger, RecheckRequest("stale", "source page changed", "fetch", stale_after_seconds=30))
    lease = ledger.claim("fetch", "w2", 30, "v1", lane="recheck")  # same version, a new lease
    ledger.commit_result(lease, "fetch", {"again": True}, follow_ups=follow_ups)
    ledger.commit_result(lease, "fetch", {"again": True}, follow_ups=follow_ups)  # a retry of that commit
    assert len(pending_rows(ledger)) == 2

    assert OutboxRelay(ledger, sink).relay_once().relayed == 2
    assert len(sink.runs) == 2 and len({extra["onceflow_dedup_key"] for _, extra in sink.events}) == 2
    assert {run_id.rsplit("__", 1)[1] for _, run_id in sink.runs} == {"t1", f"t{lease.token}"}
    assert reconcile(ledger).findings == []
    assert OutboxRelay(ledger, sink).relay_once().relayed == 0


def test_an_event_handed_to_a_task_outlet_stays_pending_until_the_task_confirms_it(ledger):
    """Issue 11 defect 6: an Asset event a running task will record on success is not marked
    relayed by the pass; a second pass delivers it again with the same event id, and consumers
    keep one per id; the task's confirmation marks it."""
    commit_one(ledger, "a:1", [FollowUp.dag_run("d"), FollowUp.asset_event("file:///a")])
    sink = RecordingSink(durable_events=False)
    first = OutboxRelay(ledger, sink).relay_once()
    assert first.relayed == 2 and len(first.awaiting) == 1
    assert [r.target for r in pending_rows(ledger)] == ["file:///a"]  # the run is durable already

    second = OutboxRelay(ledger, sink).relay_once()  # the task died before Airflow recorded it
    assert second.awaiting == first.awaiting and len(sink.events) == 2
    assert len(unique_events(sink.events, lambda e: e[1])) == 1
    assert confirm_relayed(ledger, second.awaiting) == 1
    assert pending_rows(ledger) == [] and confirm_relayed(ledger, second.awaiting) == 0


def test_a_slow_sink_does_not_hold_the_ledger_while_it_delivers(ledger):
    """Issue 11 defect 6: the relay calls the sink outside its SQLite write transaction (a 3 s
    sink used to block a claim for 2.75 s). The sink below claims an item from another thread
    and waits for that claim before returning; it only finishes if nothing holds the lock."""
    commit_one(ledger, "a:1", [FollowUp.dag_run("d")])
    ledger.add("fetch", "b:1")
    claimed = []

    class ClaimingSink(RecordingSink):
        claim_done_during_delivery = False

        def trigger_dag_run(self, dag_id, run_id, conf):
            worker = threading.Thread(target=lambda: claimed.append(ledger.claim("fetch", "w2", 30, "v1")))
            worker.start()
            worker.join(timeout=30)  # generous: a blocked claim waits for the busy timeout (60 s)
            self.claim_done_during_delivery = not worker.is_alive()
            return super().trigger_dag_run(dag_id, run_id, conf)

    sink = ClaimingSink()
    assert OutboxRelay(ledger, sink).relay_once().relayed == 1
    assert sink.claim_done_during_delivery, "the claim waited for the relay's transaction"
    assert [lease.work_key for lease in claimed] == ["b:1"] and pending_rows(ledger) == []


def test_the_reconciler_counts_a_stalled_event_handed_to_its_task_as_repaired_and_returns_it_to_confirm(
    ledger, fake_clock
):
    commit_one(ledger, "a:1", [FollowUp.asset_event("file:///a")])
    fake_clock.advance(700)
    report = reconcile(ledger, relay_stall_seconds=600, sink=RecordingSink(durable_events=False))
    assert report.count("stalled_relay", repaired=True) == 1
    ((row_id,),) = [[r.id for r in pending_rows(ledger)]]
    assert report.awaiting == [row_id] and report.as_dict()["awaiting"] == [row_id]
    assert confirm_relayed(ledger, report.awaiting) == 1 and pending_rows(ledger) == []
