"""One fence per partition, whichever mode fenced the writer (real SQLite and PostgreSQL).

A load fenced by the work ledger and a load fenced by the warehouse's own lease take their tokens
from the same ``load_fence`` row, and every overwrite checks it: a writer of one mode is refused
after a newer attempt of the other. Also: an existing warehouse of the earlier layout (a separate
``load_lease`` table, ``load_fence`` holding ledger tokens) is upgraded in place.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa

from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.ledger_link import KIND, work_key_for
from onceflow.sales.partition_store import PartitionStore, StaleAttemptError
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onceflow.ledger import Ledger

DAY = dt.date(2024, 10, 27)
KEY = work_key_for("daily_sales", DAY)
CONFIG = GeneratorConfig(seed=11, orders_per_day=30)
NIGHTLY = clean_day(DAY, CONFIG, ingested_before=dt.datetime(2024, 10, 27, 23, 0))
COMPLETE = clean_day(DAY, CONFIG)


@pytest.fixture
def store(sales_db_url: str) -> Iterator[PartitionStore]:
    engine = make_engine(sales_db_url)
    s = PartitionStore(engine, "daily_sales")
    s.create_schema()
    yield s
    engine.dispose()


def test_a_ledger_fenced_writer_is_refused_after_a_newer_warehouse_lease_commit(
    ledger: Ledger, store: PartitionStore
) -> None:
    ledger_lease = ledger.lease_key(KIND, KEY, "daily_sales/a/1", 60, PROCESSING_VERSION, reopen_reason="x")
    stale = store.register_ledger_token(DAY, token=ledger_lease.token, work_key=KEY, run_id="a", try_number=1)
    newer = store.acquire_lease(DAY, run_id="day_by_day", try_number=1)  # warehouse mode, later
    store.overwrite(newer, COMPLETE.rows, COMPLETE.rejects, processing_version=PROCESSING_VERSION)

    with pytest.raises(StaleAttemptError, match="run 'a' try 1 holds fence token 1, ledger token 1"):
        store.overwrite(stale, NIGHTLY.rows, NIGHTLY.rejects, processing_version=PROCESSING_VERSION)
    audit = store.audit(DAY)
    assert audit is not None and audit.run_id == "day_by_day" and audit.ledger_token is None
    assert store.partition_checksum(DAY) == audit.checksum
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)


def test_a_warehouse_lease_writer_is_refused_after_a_newer_ledger_commit(
    ledger: Ledger, store: PartitionStore
) -> None:
    stale = store.acquire_lease(DAY, run_id="day_by_day", try_number=1, lease_seconds=0)
    ledger_lease = ledger.lease_key(KIND, KEY, "daily_sales/b/1", 60, PROCESSING_VERSION, reopen_reason="x")
    newer = store.register_ledger_token(DAY, token=ledger_lease.token, work_key=KEY, run_id="b", try_number=1)
    store.overwrite(newer, COMPLETE.rows, COMPLETE.rejects, processing_version=PROCESSING_VERSION)

    with pytest.raises(
        StaleAttemptError, match="run 'day_by_day' try 1 holds fence token 1, the newest is 2"
    ):
        store.overwrite(stale, NIGHTLY.rows, NIGHTLY.rejects, processing_version=PROCESSING_VERSION)
    audit = store.audit(DAY)
    assert audit is not None and (audit.run_id, audit.ledger_token) == ("b", ledger_lease.token)
    assert store.partition_checksum(DAY) == audit.checksum


def test_an_unexpired_warehouse_lease_keeps_a_ledger_attempt_of_another_run_out(
    ledger: Ledger, store: PartitionStore
) -> None:
    from onceflow.sales.partition_store import PartitionLeaseHeld

    store.acquire_lease(DAY, run_id="day_by_day", try_number=1, lease_seconds=3600)
    with pytest.raises(PartitionLeaseHeld, match="leased in warehouse mode to run 'day_by_day'"):
        store.register_ledger_token(DAY, token=1, work_key=KEY, run_id="b", try_number=1)


# The layout before one fence: load_lease for warehouse-mode tokens, load_fence for ledger tokens.
OLD_TABLES = """
CREATE TABLE daily_sales (partition_date DATE NOT NULL, order_id VARCHAR(64) NOT NULL,
    customer_id VARCHAR(64), source_currency VARCHAR(8) NOT NULL, gross_cents BIGINT NOT NULL,
    refund_cents BIGINT NOT NULL, net_cents BIGINT NOT NULL, event_count INTEGER NOT NULL,
    first_event_utc TIMESTAMP NOT NULL);
CREATE TABLE rejects (table_name VARCHAR(128) NOT NULL, partition_key VARCHAR(10) NOT NULL,
    source_row_id BIGINT NOT NULL, order_id VARCHAR(64), reason VARCHAR(64) NOT NULL, raw TEXT NOT NULL);
CREATE TABLE load_audit (table_name VARCHAR(128) NOT NULL, partition_key VARCHAR(10) NOT NULL,
    row_count BIGINT NOT NULL, reject_count BIGINT NOT NULL, checksum VARCHAR(64) NOT NULL,
    run_id VARCHAR(250) NOT NULL, try_number INTEGER NOT NULL, fence_token BIGINT NOT NULL,
    processing_version VARCHAR(64) NOT NULL, loaded_at_utc TIMESTAMP NOT NULL,
    PRIMARY KEY (table_name, partition_key));
CREATE TABLE load_lease (table_name VARCHAR(128) NOT NULL, partition_key VARCHAR(10) NOT NULL,
    fence_token BIGINT NOT NULL, run_id VARCHAR(250) NOT NULL, try_number INTEGER NOT NULL,
    expires_at_utc TIMESTAMP NOT NULL, PRIMARY KEY (table_name, partition_key));
CREATE TABLE load_fence (table_name VARCHAR(128) NOT NULL, partition_key VARCHAR(10) NOT NULL,
    work_key VARCHAR(200) NOT NULL, fence_token BIGINT NOT NULL, committed_token BIGINT NOT NULL,
    run_id VARCHAR(250) NOT NULL, try_number INTEGER NOT NULL, updated_at_utc TIMESTAMP NOT NULL,
    PRIMARY KEY (table_name, partition_key));
INSERT INTO load_audit VALUES ('daily_sales', '2024-10-26', 3, 0, 'abc', 'ledger_run', 1, 4, 'v1',
    '2024-10-27 00:05:00');
INSERT INTO load_fence VALUES ('daily_sales', '2024-10-26', 'daily_sales/2024-10-26', 4, 4, 'ledger_run',
    1, '2024-10-27 00:05:00');
INSERT INTO load_lease VALUES ('daily_sales', '2024-10-27', 7, 'old_run', 1, '2024-10-28 01:00:00');
INSERT INTO load_lease VALUES ('daily_sales', '2024-10-26', 2, 'older_run', 1, '2024-10-27 01:00:00');
"""


def test_an_existing_warehouse_is_upgraded_in_place_and_old_tokens_stay_fenced(sales_db_url: str) -> None:
    from onceflow.sales.fencing import Lease

    engine = make_engine(sales_db_url)
    with engine.begin() as conn:
        for statement in OLD_TABLES.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    store.create_schema()  # a second upgrade finds nothing to do

    columns = {c["name"] for c in sa.inspect(engine).get_columns("load_audit")}
    assert {"ledger_token", "source_watermark_utc"} <= columns
    ledger_audit = store.audit("2024-10-26")
    assert ledger_audit is not None and ledger_audit.ledger_token == 4  # written by ledger token 4
    [(work_key, _)] = store.ledger_commits()
    assert work_key == "daily_sales/2024-10-26"

    # An attempt that held warehouse token 7 before the upgrade still holds the partition...
    in_flight = Lease("daily_sales", DAY, 7, "old_run", 1, dt.datetime(2024, 10, 28, 1))
    store.check_fence(in_flight)
    # ...and a ledger attempt of 2024-10-26 older than the registered ledger token 4 is refused.
    with pytest.raises(StaleAttemptError, match="ledger token 3 of run 'x' try 1 is stale"):
        store.register_ledger_token(
            dt.date(2024, 10, 26), token=3, work_key="daily_sales/2024-10-26", run_id="x", try_number=1
        )
    newer = store.register_ledger_token(
        dt.date(2024, 10, 26), token=5, work_key="daily_sales/2024-10-26", run_id="y", try_number=1
    )
    assert newer.fence_token == 5  # after the old tokens (fence 4, warehouse lease 2), never below
    old_warehouse = Lease(
        "daily_sales", dt.date(2024, 10, 26), 2, "older_run", 1, dt.datetime(2024, 10, 27, 1)
    )
    with pytest.raises(StaleAttemptError):
        store.check_fence(old_warehouse)
    engine.dispose()


def test_an_old_release_warehouse_lease_attempt_in_flight_across_the_upgrade_is_refused_at_its_commit(
    sales_db_url: str, ledger: Ledger
) -> None:
    """A load of the previous release (warehouse-lease mode, token 7 in ``load_lease``) is still
    running when a worker of this release upgrades the warehouse, then registers a ledger lease
    of the same partition and commits. The old process's own commit check (``_check_fence`` of
    f3cd951, verbatim below: it reads only ``load_lease``) must now refuse it, or it would
    overwrite the newer commit."""
    engine = make_engine(sales_db_url)
    with engine.begin() as conn:
        for statement in OLD_TABLES.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()  # the upgrade, while old_run (token 7 of load_lease) is loading DAY
    ledger_lease = ledger.lease_key(KIND, KEY, "daily_sales/new/1", 60, PROCESSING_VERSION, reopen_reason="x")
    newer = store.register_ledger_token(
        DAY, token=ledger_lease.token, work_key=KEY, run_id="new", try_number=1
    )
    store.overwrite(newer, COMPLETE.rows, COMPLETE.rejects, processing_version=PROCESSING_VERSION)

    lock = " FOR UPDATE" if engine.dialect.name == "postgresql" else ""
    with engine.begin() as conn:  # the previous release's warehouse-mode check, as SQL
        row = conn.execute(
            sa.text(f"SELECT fence_token FROM load_lease WHERE table_name = :t AND partition_key = :k{lock}"),
            {"t": "daily_sales", "k": DAY.isoformat()},
        ).one_or_none()
    old_release_would_commit = row is not None and int(row.fence_token) == 7
    assert not old_release_would_commit
    engine.dispose()


@pytest.mark.postgres
def test_the_upgrade_waits_for_an_old_release_load_mid_transaction_without_a_deadlock(
    postgres_url: str,
) -> None:
    """A warehouse-lease load of the previous release is inside its overwrite (it locked its
    ``load_lease`` row, is writing rows, has not touched ``load_audit`` yet) when the upgrade
    starts. The upgrade ALTERs ``load_audit`` and moves ``load_lease`` tokens on: if it took the
    ALTER's lock first, the old load would wait on it for ``load_audit`` while it waited on the
    old load's row (PostgreSQL aborts one as a deadlock). Both must finish, in that order."""
    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        for statement in OLD_TABLES.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    old = engine.connect()  # the previous release's overwrite transaction, statement by statement
    old.exec_driver_sql(
        "SELECT * FROM load_lease WHERE table_name = 'daily_sales' AND partition_key = '2024-10-27' FOR UPDATE"
    )
    old.exec_driver_sql("DELETE FROM daily_sales WHERE partition_date = '2024-10-27'")
    upgrade_error: list[BaseException] = []

    def run_upgrade() -> None:
        try:
            PartitionStore(engine, "daily_sales").create_schema()
        except BaseException as exc:
            upgrade_error.append(exc)

    upgrading = threading.Thread(target=run_upgrade)
    upgrading.start()
    upgrading.join(timeout=3)  # the upgrade is under way (waiting on the old load, with the fix)
    old.exec_driver_sql(
        "INSERT INTO load_audit VALUES ('daily_sales', '2024-10-27', 0, 0, 'x', 'old_run', 1, 7, 'v1', "
        "'2024-10-28 00:10:00')"
    )
    old.exec_driver_sql(
        "UPDATE load_lease SET expires_at_utc = '2024-10-28 00:10:00' "
        "WHERE table_name = 'daily_sales' AND partition_key = '2024-10-27'"
    )
    old.commit()  # raised DeadlockDetected here or in the upgrade before the fix
    old.close()
    upgrading.join(timeout=120)
    assert not upgrading.is_alive() and upgrade_error == []
    with engine.connect() as conn:
        token = conn.exec_driver_sql(
            "SELECT fence_token FROM load_lease WHERE partition_key = '2024-10-27'"
        ).scalar_one()
    assert token == 8  # moved on after the old load committed
    engine.dispose()
