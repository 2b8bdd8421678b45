"""No wait without a deadline: a lock held past lock_timeout fails the try with a clear message and
hands the ledger lease back; the next try loads once the lock is gone. Real PostgreSQL warehouse
and shop, a real ledger; the lock is a real ``LOCK TABLE`` held by another session."""

from __future__ import annotations

import datetime as dt

import pytest

from onceflow.ledger import Ledger
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.deadlines import DeadlineExceeded, Deadlines
from onceflow.sales.engine import make_engine, make_source_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.ledger_link import load_partition, work_key_for
from onceflow.sales.partition_store import AuditRecord, Lease, PartitionStore
from onceflow.testing.sales_fixtures import clean_day

pytestmark = pytest.mark.postgres

DAY = dt.date(2024, 10, 27)
DATA = clean_day(DAY, GeneratorConfig(seed=5, orders_per_day=40))
SHORT = Deadlines(lock_timeout_s=1, statement_timeout_s=0.5)


def attempt(ledger: Ledger, store: PartitionStore, try_number: int) -> AuditRecord:
    def write(lease: Lease) -> AuditRecord:
        return store.overwrite(lease, DATA.rows, DATA.rejects, processing_version=PROCESSING_VERSION)

    return load_partition(
        ledger, store, partition=DAY, owner=f"daily_sales/r/{try_number}", run_id="r",
        try_number=try_number, processing_version=PROCESSING_VERSION, write=write, lease_seconds=600,
    )  # fmt: skip


def test_a_lock_held_past_lock_timeout_fails_the_try_and_the_next_try_loads_when_it_goes(
    postgres_url: str, ledger: Ledger
) -> None:
    store = PartitionStore(make_engine(postgres_url, deadlines=Deadlines(lock_timeout_s=1)), "daily_sales")
    store.create_schema()
    blocker = make_engine(postgres_url).connect()
    try:
        blocker.exec_driver_sql("LOCK TABLE daily_sales IN SHARE MODE")  # a long report, say
        with pytest.raises(DeadlineExceeded, match=r"waited more than lock_timeout=1s for a lock") as failed:
            attempt(ledger, store, 1)
        assert "DELETE FROM" in str(failed.value) and "ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS" in str(
            failed.value
        )
        item = ledger.item(work_key_for("daily_sales", DAY))
        assert item.state != "leased"  # handed back: the next try need not wait 600 s for it
        assert store.audit(DAY) is None  # nothing half-written
        with pytest.raises(DeadlineExceeded):
            attempt(ledger, store, 2)  # still held: still refused, still not waiting forever
        blocker.rollback()  # the lock goes
        audit = attempt(ledger, store, 3)
    finally:
        blocker.close()
    assert audit.row_count == len(DATA.rows) and store.partition_checksum(DAY) == audit.checksum
    assert ledger.item(work_key_for("daily_sales", DAY)).state == "done"


@pytest.mark.parametrize("make", [make_engine, make_source_engine], ids=["warehouse", "shop"])
def test_a_statement_running_past_statement_timeout_fails_naming_the_setting(
    postgres_url: str, make: object
) -> None:
    engine = make(postgres_url, deadlines=SHORT)  # type: ignore[operator]
    with (
        pytest.raises(DeadlineExceeded, match=r"statement ran longer than statement_timeout=0\.5s"),
        engine.connect() as conn,
    ):
        conn.exec_driver_sql("SELECT pg_sleep(3)")
    with engine.connect() as conn:  # the session is still usable: the setting, not a broken pool
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "1s"


def test_deadlines_must_be_positive_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS", "0")
    with pytest.raises(ValueError, match="must be positive"):
        Deadlines.from_env()
    monkeypatch.setenv("ONCEFLOW_SALES_LOCK_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ValueError, match="number of seconds"):
        Deadlines.from_env()
