"""Partition loads through the work ledger, in-process: the ledger's token fences the warehouse.

Real ledger and warehouse databases (SQLite and PostgreSQL), a fake ledger clock. The process
versions (SIGSTOP, SIGKILL) are in ``test_partition_crash.py``.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import pytest

from onceflow.ledger import LeaseHeld
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.ledger_checks import record_missing_results
from onceflow.sales.ledger_link import KIND, load_partition, work_key_for
from onceflow.sales.partition_store import AuditRecord, PartitionStore, StaleAttemptError
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.sales.partition_store import Lease
    from onceflow.testing.clock import FakeClock

DAY = dt.date(2024, 10, 27)
KEY = work_key_for("daily_sales", DAY)
CONFIG = GeneratorConfig(seed=5, orders_per_day=40)
NIGHTLY = clean_day(DAY, CONFIG, ingested_before=dt.datetime(2024, 10, 27, 23, 0))
COMPLETE = clean_day(DAY, CONFIG)


@pytest.fixture
def store(sales_db_url: str) -> PartitionStore:
    s = PartitionStore(make_engine(sales_db_url), "daily_sales")
    s.create_schema()
    return s


def attempt(
    ledger: Ledger, store: PartitionStore, run_id: str, try_number: int, data: object = COMPLETE
) -> AuditRecord:
    def write(lease: Lease) -> AuditRecord:
        return store.overwrite(lease, data.rows, data.rejects, processing_version=PROCESSING_VERSION)  # type: ignore[attr-defined]

    return load_partition(
        ledger, store, partition=DAY, owner=f"daily_sales/{run_id}/{try_number}", run_id=run_id,
        try_number=try_number, processing_version=PROCESSING_VERSION, write=write, lease_seconds=60,
    )  # fmt: skip


def test_a_load_leaves_a_done_item_whose_result_is_the_audit(ledger: Ledger, store: PartitionStore) -> None:
    audit = attempt(ledger, store, "scheduled__1", 1)
    item = ledger.item(KEY)
    assert (item.kind, item.state, item.fencing_token) == (KIND, "done", 1)
    [result] = ledger.results(KEY)
    assert result.payload["checksum"] == audit.checksum == store.partition_checksum(DAY)
    assert result.payload["row_count"] == audit.row_count == len(COMPLETE.rows)
    assert result.processing_version == audit.processing_version
    assert audit.ledger_token == result.fencing_token == 1


def test_a_zombie_with_an_older_ledger_token_is_refused_in_the_overwrite_and_recorded(
    ledger: Ledger, store: PartitionStore, fake_clock: FakeClock
) -> None:
    zombie = ledger.lease_key(KIND, KEY, "daily_sales/r/1", 60, PROCESSING_VERSION, reopen_reason="x")
    zombie_lease = store.register_ledger_token(
        DAY, token=zombie.token, work_key=KEY, run_id="r", try_number=1
    )
    fake_clock.advance(61)  # its heartbeat stopped; the lease lapsed
    newer = attempt(ledger, store, "r", 2, NIGHTLY)  # takes the item (reclaim_expired), commits
    with pytest.raises(StaleAttemptError, match="ledger token 1, the newest is 2"):
        store.overwrite(zombie_lease, COMPLETE.rows, None, processing_version=PROCESSING_VERSION)
    assert ledger.record_refusal(zombie, "warehouse refused the overwrite")
    assert store.partition_checksum(DAY) == newer.checksum
    assert [(t.event, t.fencing_token) for t in ledger.history(KEY)][-3:] == [
        ("reclaim_expired", 2), ("complete", 2), ("commit_refused", 1)
    ]  # fmt: skip


def test_a_zombie_is_refused_even_before_the_newer_attempt_commits(
    ledger: Ledger, store: PartitionStore, fake_clock: FakeClock
) -> None:
    zombie = ledger.lease_key(KIND, KEY, "daily_sales/r/1", 60, PROCESSING_VERSION, reopen_reason="x")
    zombie_lease = store.register_ledger_token(
        DAY, token=zombie.token, work_key=KEY, run_id="r", try_number=1
    )
    fake_clock.advance(61)
    newer = ledger.lease_key(KIND, KEY, "daily_sales/r/2", 60, PROCESSING_VERSION, reopen_reason="x")
    store.register_ledger_token(DAY, token=newer.token, work_key=KEY, run_id="r", try_number=2)
    with pytest.raises(StaleAttemptError):
        store.overwrite(zombie_lease, COMPLETE.rows, None, processing_version=PROCESSING_VERSION)
    assert store.audit(DAY) is None and store.partition_rows(DAY) == []
    with pytest.raises(StaleAttemptError, match="ledger token 1 of run 'r' try 1 is stale"):
        store.register_ledger_token(DAY, token=1, work_key=KEY, run_id="r", try_number=1)


def test_a_current_lease_keeps_another_attempt_out(ledger: Ledger, store: PartitionStore) -> None:
    ledger.lease_key(KIND, KEY, "daily_sales/a/1", 60, PROCESSING_VERSION, reopen_reason="x")
    with pytest.raises(LeaseHeld, match="daily_sales/a/1"):
        attempt(ledger, store, "b", 1)
    assert store.audit(DAY) is None


def test_a_failed_write_gives_the_item_back_for_the_next_try(ledger: Ledger, store: PartitionStore) -> None:
    def broken(_lease: Lease) -> AuditRecord:
        raise ConnectionError("warehouse went away")

    with pytest.raises(ConnectionError):
        load_partition(
            ledger, store, partition=DAY, owner="daily_sales/r/1", run_id="r", try_number=1,
            processing_version=PROCESSING_VERSION, write=broken,
        )  # fmt: skip
    item = ledger.item(KEY)
    assert (item.state, item.last_error_class) == ("pending", "ConnectionError")
    assert attempt(ledger, store, "r", 2).fence_token == 2
    assert ledger.item(KEY).state == "done"


def test_the_reconciler_records_a_result_the_ledger_missed_once(
    ledger: Ledger, store: PartitionStore
) -> None:
    attempt(ledger, store, "r", 1, NIGHTLY)
    # Try 1 of the next run committed in the warehouse and died before the ledger commit.
    lease = ledger.lease_key(KIND, KEY, "daily_sales/m/1", 60, PROCESSING_VERSION, reopen_reason="reload")
    wl = store.register_ledger_token(DAY, token=lease.token, work_key=KEY, run_id="m", try_number=1)
    audit = store.overwrite(wl, COMPLETE.rows, None, processing_version=PROCESSING_VERSION)

    [finding] = record_missing_results(ledger, store)
    assert (finding.check, finding.work_key, finding.repaired) == ("partition_result_missing", KEY, True)
    [result] = ledger.results(KEY)
    assert (result.fencing_token, result.payload["checksum"], result.committed_by) == (
        2,
        audit.checksum,
        "reconciler",
    )
    assert ledger.item(KEY).state == "done"
    history = ledger.history(KEY)
    assert history[-1].event == "record_result" and history[-1].actor == "reconciler"
    assert record_missing_results(ledger, store) == []
    assert ledger.history(KEY) == history
    # Had the holder only been slow, its own ledger commit now returns the recorded result:
    # the same token's result exists, so the designated write is idempotent and changes nothing.
    assert ledger.commit_result(lease, "load", {"checksum": "late"}).payload["checksum"] == audit.checksum
    assert ledger.history(KEY) == history


def test_the_heartbeat_extends_the_lease_while_loading(ledger_url: str) -> None:
    import time

    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.ledger.keyed import Heartbeat

    ledger = Ledger(create_ledger_engine(ledger_url))  # the real clock: the thread heartbeats for real
    lease = ledger.lease_key(KIND, KEY, "daily_sales/r/1", 30, PROCESSING_VERSION, reopen_reason="x")
    first = ledger.item(KEY).lease_expires_at
    assert first is not None
    with Heartbeat(lease, interval=0.05) as beat:
        deadline = time.monotonic() + 60  # readiness, not speed
        while (ledger.item(KEY).lease_expires_at or 0) <= first:
            assert time.monotonic() < deadline, "no heartbeat reached the ledger"
            time.sleep(0.05)
    assert beat.lost is None


def test_the_heartbeat_notices_a_lost_lease(ledger: Ledger, fake_clock: FakeClock) -> None:
    import time

    from onceflow.ledger.keyed import Heartbeat

    old = ledger.lease_key(KIND, KEY, "daily_sales/r/1", 60, PROCESSING_VERSION, reopen_reason="x")
    fake_clock.advance(61)
    ledger.lease_key(KIND, KEY, "daily_sales/r/2", 60, PROCESSING_VERSION, reopen_reason="x")
    with Heartbeat(old, interval=0.01) as beat:
        deadline = time.monotonic() + 60
        while beat.lost is None:
            assert time.monotonic() < deadline, "the lost lease was never noticed"
            time.sleep(0.02)
    assert (beat.lost.token, beat.lost.current_token) == (1, 2)
    assert ledger.item(KEY).lease_owner == "daily_sales/r/2"
