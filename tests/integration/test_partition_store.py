"""The fenced partition overwrite against real databases (SQLite file and PostgreSQL)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
from typing import TYPE_CHECKING

import pytest

from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionLeaseHeld, PartitionStore, StaleAttemptError
from onceflow.sales.partitions import InvalidNameError
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Iterator

DAY = dt.date(2024, 10, 27)  # 25 hours in Europe/Amsterdam
CONFIG = GeneratorConfig(seed=5, orders_per_day=120)
# The shop as the nightly run saw it (before late rows arrived), and as a re-run sees it later.
NIGHTLY = clean_day(DAY, CONFIG, ingested_before=dt.datetime(2024, 10, 27, 23, 0))
COMPLETE = clean_day(DAY, CONFIG)


class FakeClock:
    def __init__(self) -> None:
        self.now = dt.datetime(2024, 10, 28, 0, 5)

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(sales_db_url: str, clock: FakeClock) -> Iterator[PartitionStore]:
    engine = make_engine(sales_db_url)
    s = PartitionStore(engine, "daily_sales", clock=clock)
    s.create_schema()
    yield s
    engine.dispose()


def load(store: PartitionStore, result: object, run_id: str = "scheduled__1", try_number: int = 1) -> object:
    lease = store.acquire_lease(DAY, run_id=run_id, try_number=try_number)
    return store.overwrite(
        lease,
        result.rows,  # type: ignore[attr-defined]
        result.rejects,  # type: ignore[attr-defined]
        processing_version=PROCESSING_VERSION,
    )


def test_the_late_rows_make_the_two_sources_differ() -> None:
    assert len(COMPLETE.rows) > len(NIGHTLY.rows) or COMPLETE.rows.equals(NIGHTLY.rows) is False


def test_an_overwrite_replaces_the_partition_and_never_appends(store: PartitionStore) -> None:
    load(store, NIGHTLY)
    other_day = dataclasses.replace(NIGHTLY, rows=NIGHTLY.rows.assign(partition_date=dt.date(2024, 10, 26)))
    lease = store.acquire_lease(dt.date(2024, 10, 26), run_id="scheduled__0", try_number=1)
    store.overwrite(lease, other_day.rows, None, processing_version=PROCESSING_VERSION)
    audit = load(store, COMPLETE, run_id="manual__2")
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows) == audit.row_count  # type: ignore[attr-defined]
    assert store.partition_checksum(DAY) == audit.checksum  # type: ignore[attr-defined]
    # The neighbouring partition is untouched.
    assert len(store.partition_rows(dt.date(2024, 10, 26))) == len(NIGHTLY.rows)


def test_a_rerun_gives_the_same_checksum_and_one_audit_row(store: PartitionStore, clock: FakeClock) -> None:
    first = load(store, COMPLETE)
    clock.now += dt.timedelta(hours=2)
    second = load(store, COMPLETE, try_number=2)
    assert first.checksum == second.checksum == store.partition_checksum(DAY)  # type: ignore[attr-defined]
    assert first.loaded_at_utc != second.loaded_at_utc  # type: ignore[attr-defined]
    audits = list(store.audits())
    assert len(audits) == 1
    assert (audits[0].try_number, audits[0].row_count) == (2, len(COMPLETE.rows))


def test_the_audit_row_answers_is_the_day_loaded(store: PartitionStore) -> None:
    assert store.audit(DAY) is None
    load(store, COMPLETE)
    audit = store.audit("2024-10-27")
    assert audit is not None
    assert (audit.run_id, audit.try_number, audit.processing_version) == (
        "scheduled__1",
        1,
        PROCESSING_VERSION,
    )
    assert audit.reject_count == len(COMPLETE.rejects) > 0


def test_a_zombie_with_an_older_try_is_refused_at_commit(store: PartitionStore) -> None:
    zombie = store.acquire_lease(DAY, run_id="scheduled__1", try_number=1)
    newer = store.acquire_lease(DAY, run_id="scheduled__1", try_number=2)
    store.overwrite(newer, COMPLETE.rows, COMPLETE.rejects, processing_version=PROCESSING_VERSION)
    with pytest.raises(StaleAttemptError, match="try 1 holds fence token 1, the newest is 2"):
        store.overwrite(zombie, NIGHTLY.rows, NIGHTLY.rejects, processing_version=PROCESSING_VERSION)
    assert store.partition_checksum(DAY) == store.audit(DAY).checksum  # type: ignore[union-attr]
    assert store.audit(DAY).try_number == 2  # type: ignore[union-attr]
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)


def test_a_zombie_is_refused_even_before_the_newer_try_commits(store: PartitionStore) -> None:
    zombie = store.acquire_lease(DAY, run_id="scheduled__1", try_number=1)
    store.acquire_lease(DAY, run_id="scheduled__1", try_number=2)
    with pytest.raises(StaleAttemptError):
        store.overwrite(zombie, NIGHTLY.rows, None, processing_version=PROCESSING_VERSION)
    assert store.partition_rows(DAY) == []


def test_an_older_try_cannot_even_take_a_lease_after_a_newer_one(store: PartitionStore) -> None:
    store.acquire_lease(DAY, run_id="scheduled__1", try_number=3)
    with pytest.raises(StaleAttemptError, match="try 3 already took the partition"):
        store.acquire_lease(DAY, run_id="scheduled__1", try_number=2)


def test_another_runs_unexpired_lease_keeps_a_second_run_out(store: PartitionStore, clock: FakeClock) -> None:
    store.acquire_lease(DAY, run_id="scheduled__1", try_number=1)
    with pytest.raises(PartitionLeaseHeld, match="leased to run 'scheduled__1'"):
        store.acquire_lease(DAY, run_id="manual__2", try_number=1)


def test_an_older_run_whose_lease_expired_cannot_overwrite_the_newer_run(
    store: PartitionStore, clock: FakeClock
) -> None:
    old = store.acquire_lease(DAY, run_id="scheduled__1", try_number=1)
    clock.now += dt.timedelta(hours=2)  # the old run stalled past its one-hour lease
    new = store.acquire_lease(DAY, run_id="manual__2", try_number=1)
    store.overwrite(new, COMPLETE.rows, COMPLETE.rejects, processing_version=PROCESSING_VERSION)
    with pytest.raises(StaleAttemptError, match="run 'scheduled__1' try 1 holds fence token 1"):
        store.overwrite(old, NIGHTLY.rows, NIGHTLY.rejects, processing_version=PROCESSING_VERSION)
    assert store.audit(DAY).run_id == "manual__2"  # type: ignore[union-attr]


def test_a_warehouse_lease_expires_by_the_database_clock_not_a_skewed_worker_clock(
    sales_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A's clock runs two hours behind. Its warehouse-mode lease must still keep worker B
    out: expiry comes from the warehouse database's clock, as the work ledger's leases do. (With
    A's own clock the lease was written already expired and B took the partition while A loaded.)
    The skew is simulated in-process by the process clock A's store reads (a real skewed host
    clock cannot be made here without privileges)."""
    import onceflow.sales.partition_store as partition_store

    class Behind(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Behind:
            return super().now(tz) - dt.timedelta(hours=2)

    engine = make_engine(sales_db_url)
    try:
        worker_a, worker_b = PartitionStore(engine, "daily_sales"), PartitionStore(engine, "daily_sales")
        worker_a.create_schema()
        with monkeypatch.context() as m:
            m.setattr(partition_store, "dt", types.SimpleNamespace(datetime=Behind, timezone=dt.timezone))
            worker_a.acquire_lease(DAY, run_id="scheduled__a", try_number=1, lease_seconds=600)
        with pytest.raises(PartitionLeaseHeld, match="leased to run 'scheduled__a'"):
            worker_b.acquire_lease(DAY, run_id="manual__b", try_number=1)
    finally:
        engine.dispose()


def test_rejects_are_replaced_per_partition_with_their_reasons(store: PartitionStore) -> None:
    load(store, COMPLETE)
    load(store, COMPLETE, try_number=2)
    rejects = store.partition_rejects(DAY)
    assert len(rejects) == len(COMPLETE.rejects)
    assert {r["reason"] for r in rejects} == set(COMPLETE.reasons())


def test_recording_rejects_alone_leaves_the_rows(store: PartitionStore) -> None:
    load(store, COMPLETE)
    lease = store.acquire_lease(DAY, run_id="scheduled__1", try_number=2)
    store.record_rejects(lease, COMPLETE.rejects.iloc[:1])
    assert len(store.partition_rejects(DAY)) == 1
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)


def test_rows_of_another_partition_are_refused(store: PartitionStore) -> None:
    lease = store.acquire_lease(dt.date(2024, 10, 28), run_id="x", try_number=1)
    with pytest.raises(ValueError, match="rows for partitions"):
        store.overwrite(lease, COMPLETE.rows, None, processing_version=PROCESSING_VERSION)


def test_an_empty_day_loads_an_empty_partition_and_says_so(store: PartitionStore) -> None:
    load(store, COMPLETE)
    empty = dataclasses.replace(COMPLETE, rows=COMPLETE.rows.iloc[0:0], rejects=COMPLETE.rejects.iloc[0:0])
    audit = load(store, empty, try_number=2)
    assert audit.row_count == 0  # type: ignore[attr-defined]
    assert store.partition_rows(DAY) == []


def test_injection_shaped_table_names_never_reach_the_database(sales_db_url: str) -> None:
    engine = make_engine(sales_db_url)
    with pytest.raises(InvalidNameError):
        PartitionStore(engine, "daily_sales; DROP TABLE load_audit; --")
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
@pytest.mark.parametrize("method", ["copy", "insert", "executemany", "to_sql"])
def test_every_load_method_writes_the_same_partition_on_postgres(
    postgres_url: str, driver: str, method: str
) -> None:
    url = postgres_url.replace("postgresql+psycopg2://", f"postgresql+{driver}://")
    engine = make_engine(url)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    lease = store.acquire_lease(DAY, run_id="r", try_number=1)
    rows = COMPLETE.rows.copy()
    rows.loc[0, "customer_id"] = None  # NULLs must survive every path (COPY: empty CSV field)
    audit = store.overwrite(lease, rows, None, processing_version=PROCESSING_VERSION, method=method)  # type: ignore[arg-type]
    assert store.partition_checksum(DAY) == audit.checksum
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)
    assert store.partition_rows(DAY)[0][2] is None
    engine.dispose()
