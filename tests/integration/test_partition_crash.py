"""kill -9 during a partition load, and a zombie attempt, with real processes and real databases.

A worker subprocess runs the real load code and pauses at a named point by writing a file and
waiting; the test then SIGKILLs it (or lets it resume) and inspects the warehouse. The same crash
with a plain append load shows the duplicates that overwrite-by-partition avoids.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.sales.checksum import rows_checksum
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionStore, frame_records
from onceflow.sales.schema import SALES_COLUMNS
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Callable

    from onceflow.ledger import Ledger

DAY = dt.date(2024, 3, 31)  # 23 hours in Europe/Amsterdam
CONFIG = GeneratorConfig(seed=9, orders_per_day=150)
CUTOFF = "2024-03-31T22:00:00"  # before the late rows arrived
NIGHTLY = clean_day(DAY, CONFIG, ingested_before=dt.datetime.fromisoformat(CUTOFF))
COMPLETE = clean_day(DAY, CONFIG)
RUN = "manual__rerun"
COMPLETE_CHECKSUM = rows_checksum(frame_records(COMPLETE.rows, SALES_COLUMNS))

WORKER = r"""
import datetime as dt, pathlib, sys, time
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionStore, StaleAttemptError
from onceflow.testing.sales_fixtures import clean_day

url, mode, pause_at, signal_dir, run_id, try_number = sys.argv[1:7]
signals = pathlib.Path(signal_dir)
day = dt.date(2024, 3, 31)
result = clean_day(day, GeneratorConfig(seed=9, orders_per_day=150))

def pause(stage):
    if stage == pause_at:
        (signals / "paused").write_text(stage)
        while not (signals / "resume").exists():
            time.sleep(0.02)

store = PartitionStore(make_engine(url), "daily_sales")
if mode == "append":
    store.append(result.rows, chunk_size=50, checkpoint=pause)
    sys.exit(0)
lease = store.acquire_lease(day, run_id=run_id, try_number=int(try_number))
pause("acquired")
try:
    store.overwrite(
        lease, result.rows, result.rejects, processing_version=PROCESSING_VERSION, checkpoint=pause
    )
except StaleAttemptError as err:
    print(f"REFUSED: {err}", file=sys.stderr)
    sys.exit(3)
"""


def start_worker(
    url: str, mode: str, pause_at: str, signals: Path, try_number: int = 1
) -> subprocess.Popen[str]:
    signals.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, url, mode, pause_at, str(signals), RUN, str(try_number)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_paused(proc: subprocess.Popen[str], signals: Path, stage: str) -> None:
    deadline = time.monotonic() + 120  # a readiness wait, not an assertion on speed
    while not (signals / "paused").exists():
        if proc.poll() is not None:
            pytest.fail(
                f"worker exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("worker never reached its pause point")
        time.sleep(0.02)
    assert (signals / "paused").read_text() == stage


def kill9(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture
def store(sales_db_url: str) -> PartitionStore:
    s = PartitionStore(make_engine(sales_db_url), "daily_sales")
    s.create_schema()
    return s


def load_nightly(store: PartitionStore) -> str:
    lease = store.acquire_lease(DAY, run_id="scheduled__2024-03-30T22:00:00+00:00", try_number=1)
    return store.overwrite(
        lease, NIGHTLY.rows, NIGHTLY.rejects, processing_version=PROCESSING_VERSION
    ).checksum


def retry(store: PartitionStore, try_number: int) -> str:
    lease = store.acquire_lease(DAY, run_id=RUN, try_number=try_number)
    return store.overwrite(
        lease, COMPLETE.rows, COMPLETE.rejects, processing_version=PROCESSING_VERSION
    ).checksum


def test_the_two_versions_of_the_day_differ() -> None:
    assert len(COMPLETE.rows) != len(NIGHTLY.rows)


@pytest.mark.parametrize("stage", ["deleted", "rows_written"])
def test_kill_9_inside_the_overwrite_leaves_the_old_rows_and_the_retry_loads_the_new(
    store: PartitionStore, sales_db_url: str, tmp_path: Path, stage: str
) -> None:
    old = load_nightly(store)
    proc = start_worker(sales_db_url, "overwrite", stage, tmp_path / "signals")
    wait_until_paused(proc, tmp_path / "signals", stage)
    kill9(proc)

    # Old rows, whole: not deleted, not mixed with the new ones.
    assert store.partition_checksum(DAY) == old
    assert len(store.partition_rows(DAY)) == len(NIGHTLY.rows)
    assert store.audit(DAY).run_id.startswith("scheduled__")  # type: ignore[union-attr]

    new = retry(store, try_number=2)
    assert store.partition_checksum(DAY) == new
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)
    assert Counter(r[1] for r in store.partition_rows(DAY)).most_common(1)[0][1] == 1


def test_kill_9_after_the_commit_and_a_retry_is_harmless(
    store: PartitionStore, sales_db_url: str, tmp_path: Path
) -> None:
    load_nightly(store)
    proc = start_worker(sales_db_url, "overwrite", "committed", tmp_path / "signals")
    wait_until_paused(proc, tmp_path / "signals", "committed")
    kill9(proc)  # the load committed but the task died before reporting success
    committed = store.partition_checksum(DAY)
    assert store.audit(DAY).run_id == RUN  # type: ignore[union-attr]

    assert retry(store, try_number=2) == committed
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)


def test_a_retried_append_load_duplicates_rows_where_overwrite_does_not(
    store: PartitionStore, sales_db_url: str, tmp_path: Path
) -> None:
    """The seed's "idempotent versus append retries", measured on the same crash."""
    proc = start_worker(sales_db_url, "append", "chunk_committed:0", tmp_path / "signals")
    wait_until_paused(proc, tmp_path / "signals", "chunk_committed:0")
    kill9(proc)
    assert len(store.partition_rows(DAY)) == 50  # a torn partition: the first chunk only

    store.append(COMPLETE.rows, chunk_size=50)  # the retry
    rows = store.partition_rows(DAY)
    duplicated = {order for order, n in Counter(r[1] for r in rows).items() if n > 1}
    assert len(rows) == len(COMPLETE.rows) + 50
    assert len(duplicated) == 50

    # The same retry as a partition overwrite repairs it to exactly the expected rows.
    assert retry(store, try_number=1) == store.partition_checksum(DAY)
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)


# -- through the work ledger: the attempt's fencing token comes from the ledger ---------------

LEDGER_WORKER = r"""
import datetime as dt, pathlib, sys, time
from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.sales.ledger_link import load_partition
from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionStore, StaleAttemptError
from onceflow.testing.sales_fixtures import clean_day

url, ledger_url, pause_at, signal_dir, run_id, try_number, data, lease_seconds = sys.argv[1:9]
signals = pathlib.Path(signal_dir)
day = dt.date(2024, 3, 31)
cutoff = dt.datetime.fromisoformat("2024-03-31T22:00:00") if data == "nightly" else None
result = clean_day(day, GeneratorConfig(seed=9, orders_per_day=150), ingested_before=cutoff)

def pause(stage):
    if stage == pause_at:
        (signals / "paused").write_text(stage)
        while not (signals / "resume").exists():
            time.sleep(0.02)

store = PartitionStore(make_engine(url), "daily_sales")
ledger = Ledger(create_ledger_engine(ledger_url))
try:
    audit = load_partition(
        ledger, store, partition=day, owner=f"daily_sales/{run_id}/{try_number}", run_id=run_id,
        try_number=int(try_number), processing_version=PROCESSING_VERSION, lease_seconds=float(lease_seconds),
        write=lambda lease: store.overwrite(lease, result.rows, result.rejects, processing_version=PROCESSING_VERSION),
        checkpoint=pause,
    )
except StaleAttemptError as err:
    print(f"REFUSED: {err}", file=sys.stderr)
    sys.exit(3)
print(audit.checksum)
"""


@pytest.fixture
def ledger_db_url(sales_db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh ledger database on the same backend as the warehouse (a different database)."""
    if sales_db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_url_factory")("ledger"))


def start_ledger_worker(
    url: str, ledger_url: str, pause_at: str, signals: Path, *, try_number: int, data: str, lease: float
) -> subprocess.Popen[str]:
    signals.mkdir(exist_ok=True)
    args = [url, ledger_url, pause_at, str(signals), RUN, str(try_number), data, str(lease)]
    return subprocess.Popen(
        [sys.executable, "-c", LEDGER_WORKER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def open_ledger(url: str) -> Ledger:
    from onceflow.ledger import Ledger, create_ledger_engine

    return Ledger(create_ledger_engine(url))


def test_a_zombie_process_with_an_old_try_is_refused_at_commit(
    store: PartitionStore, sales_db_url: str, ledger_db_url: str, tmp_path: Path
) -> None:
    """Try 1 is frozen (SIGSTOP) past its ledger lease; try 2 takes the item and commits; try 1
    wakes up (SIGCONT) and is refused by the warehouse because its ledger token is older."""
    from onceflow.sales.ledger_link import work_key_for

    ledger = open_ledger(ledger_db_url)
    key = work_key_for("daily_sales", DAY)
    zombie = start_ledger_worker(
        sales_db_url, ledger_db_url, "registered", tmp_path / "z", try_number=1, data="nightly", lease=2
    )
    wait_until_paused(zombie, tmp_path / "z", "registered")
    os.kill(zombie.pid, signal.SIGSTOP)  # its heartbeat thread stops with it
    try:
        (tmp_path / "z" / "resume").write_text("go")  # it will continue once SIGCONT arrives
        deadline = time.monotonic() + 120  # readiness: wait for the frozen lease to lapse
        while (ledger.item(key).lease_expires_at or 0) > time.time():
            assert time.monotonic() < deadline, "the zombie's lease never expired"
            time.sleep(0.1)

        newer = start_ledger_worker(
            sales_db_url, ledger_db_url, "-", tmp_path / "n", try_number=2, data="complete", lease=60
        )
        out, err = newer.communicate(timeout=120)
        assert newer.returncode == 0, err
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    _, stderr = zombie.communicate(timeout=120)

    assert zombie.returncode == 3, stderr
    assert "REFUSED" in stderr and "ledger token 1, the newest is 2" in stderr
    assert store.partition_checksum(DAY) == out.strip() == COMPLETE_CHECKSUM
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)
    audit = store.audit(DAY)
    assert audit is not None and (audit.try_number, audit.fence_token) == (2, 2)
    item = ledger.item(key)
    assert (item.state, item.fencing_token) == ("done", 2)
    refused = [t for t in ledger.history(key) if t.event == "commit_refused"]
    assert [(t.fencing_token, t.owner) for t in refused] == [(1, f"daily_sales/{RUN}/1")]
    assert "warehouse refused" in (refused[0].reason or "")
    [result] = ledger.results(key)
    assert (result.fencing_token, result.payload["checksum"]) == (2, COMPLETE_CHECKSUM)


def test_kill_9_between_the_warehouse_and_the_ledger_commit_is_repaired_by_the_reconciler(
    store: PartitionStore, sales_db_url: str, ledger_db_url: str, tmp_path: Path
) -> None:
    from onceflow.ledger.reconcile import reconcile
    from onceflow.sales.ledger_checks import partition_load_check
    from onceflow.sales.ledger_link import work_key_for

    ledger = open_ledger(ledger_db_url)
    key = work_key_for("daily_sales", DAY)
    proc = start_ledger_worker(
        sales_db_url, ledger_db_url, "warehouse_committed", tmp_path / "s", try_number=1, data="complete",
        lease=60,
    )  # fmt: skip
    wait_until_paused(proc, tmp_path / "s", "warehouse_committed")
    kill9(proc)

    # The warehouse has the load; the ledger still shows the (dead) lease and no result.
    audit = store.audit(DAY)
    assert audit is not None and audit.checksum == COMPLETE_CHECKSUM and audit.fence_token == 1
    assert ledger.item(key).state == "leased" and ledger.results(key) == []

    check = partition_load_check(store)
    first = reconcile(ledger, grace_seconds=3600, extra_checks=[check])
    assert first.count("partition_result_missing", repaired=True) == 1
    assert ledger.item(key).state == "done"
    [result] = ledger.results(key)
    assert (result.fencing_token, result.committed_by) == (1, "reconciler")
    assert result.payload["checksum"] == COMPLETE_CHECKSUM and result.payload["partition"] == "2024-03-31"
    recorded = [t for t in ledger.history(key) if t.event == "record_result"]
    assert [(t.actor, t.fencing_token, t.to_state) for t in recorded] == [("reconciler", 1, "done")]

    history = ledger.history(key)
    second = reconcile(ledger, grace_seconds=3600, extra_checks=[check])
    assert second.findings == []
    assert ledger.history(key) == history and len(ledger.results(key)) == 1


# -- The same crashes as real Airflow tasks under the scheduler -----------------------------------
#
# The repo's daily_sales DAG file, copied under other DAG ids with a 6-second ledger lease and
# short retry delays, run by a real cluster (scheduler, LocalExecutor, api-server). The task process
# pauses at a named point of its load (onceflow.testing.crash_points, through the load's own
# checkpoint callback); the test then SIGKILLs or SIGSTOPs that process, the one the scheduler
# started. Warehouse and ledger are PostgreSQL databases, as in production.

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"


def sales_dag_copy(dag_id: str, *, retries: int) -> str:
    """dags/daily_sales.py as ``dag_id``: short lease and retry delay, crash points installed."""
    source = (DAGS_DIR / "daily_sales.py").read_text()
    edits = {
        'dag_id="daily_sales"': f'dag_id="{dag_id}"',
        '"retries": CONFIG.retries': f'"retries": {retries}',
        '"retry_delay": dt.timedelta(minutes=5)': '"retry_delay": dt.timedelta(seconds=2)',
        "max_reject_ratio=CONFIG.max_reject_ratio,": "max_reject_ratio=CONFIG.max_reject_ratio, lease_seconds=6,",
    }
    for old, new in edits.items():
        assert source.count(old) == 1, f"dags/daily_sales.py no longer contains {old!r}"
        source = source.replace(old, new)
    return source + "\nfrom onceflow.testing.crash_points import install_from_env\n\ninstall_from_env()\n"


def run_of(cluster: Any, backfill_id: int) -> dict[str, Any]:
    from onceflow.testing.sales_backfill import wait_for_backfill

    [run] = wait_for_backfill(cluster, backfill_id, timeout=600)
    return run


@pytest.mark.slow  # 130 s; the same kill -9 and zombie as plain processes stay in make test
@pytest.mark.real_airflow
@pytest.mark.postgres
def test_kill_9_and_a_zombie_as_real_airflow_tasks_under_the_scheduler(
    airflow_cluster_factory: Callable[..., Any],
    postgres_url_factory: Callable[..., str],
    shop_orders: Callable[..., Any],
    tmp_path: Path,
) -> None:
    from onceflow.sales.ledger_link import work_key_for
    from onceflow.testing.crash_points import marker, wait_until_paused
    from onceflow.testing.sales_backfill import create_backfill

    shop, warehouse, ledger_url = (postgres_url_factory(t) for t in ("crashshop", "crashwh", "crashledger"))
    shop_orders(shop, DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=1), seed=9, orders_per_day=150)
    dags, points = tmp_path / "dags", tmp_path / "points"
    dags.mkdir()
    points.mkdir()
    for dag_id, retries in (("sales_crash", 5), ("sales_zombie", 0), ("sales_rival", 5)):
        (dags / f"{dag_id}.py").write_text(sales_dag_copy(dag_id, retries=retries))

    def conn(url: str) -> str:
        return json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}})

    cluster = airflow_cluster_factory(
        dags_folder=dags,
        pools={"onceflow_warehouse": 4},
        env={
            "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": conn(shop),
            "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": conn(warehouse),
            "AIRFLOW_CONN_ONCEFLOW_LEDGER": conn(ledger_url),
            "ONCEFLOW_SALES_STAGING_DIR": str(tmp_path / "staging"),
            "ONCEFLOW_SALES_START_DATE": "2099-01-01",  # only the backfills create runs
            "ONCEFLOW_CRASH_POINTS": "sales_crash:rows_written:1,sales_zombie:registered:1",
            "ONCEFLOW_CRASH_POINTS_DIR": str(points),
        },
    )
    for dag_id in ("sales_crash", "sales_zombie", "sales_rival"):
        cluster.wait_for_dag(dag_id)
    store = PartitionStore(make_engine(warehouse), "daily_sales")
    ledger = open_ledger(ledger_url)
    key = work_key_for("daily_sales", DAY)

    def backfill(dag_id: str) -> int:
        return create_backfill(cluster, dag_id, DAY, DAY, timezone=CONFIG.timezone, max_active_runs=1)

    # 1. kill -9 inside the overwrite transaction, after the rows were written (not committed).
    crash = backfill("sales_crash")
    pid = wait_until_paused(points, "sales_crash", "rows_written", 1, timeout=300)
    with store.engine.connect() as conn_:
        in_txn = conn_.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
            )
        ).scalar()
    assert in_txn >= 1, "the paused load holds an open transaction"
    assert store.audit(DAY) is None and store.partition_rows(DAY) == []  # nothing visible yet
    os.kill(pid, signal.SIGKILL)
    run = run_of(cluster, crash)
    [load] = [t for t in cluster.task_instances("sales_crash") if t["task_id"] == "load"]
    assert run["state"] == "success", cluster.task_log_tails("sales_crash")
    assert load["try_number"] >= 2  # Airflow retried the killed try
    assert store.partition_checksum(DAY) == COMPLETE_CHECKSUM  # read back: exactly the day, once
    assert len(store.partition_rows(DAY)) == len(COMPLETE.rows)
    audit = store.audit(DAY)
    assert audit is not None and audit.run_id == run["run_id"] and audit.try_number >= 2

    # 2. A zombie: try 1 of sales_zombie is frozen (SIGSTOP) after registering its ledger token,
    # past its 6-second lease; sales_rival loads the day meanwhile; the zombie wakes and is refused.
    zombie = backfill("sales_zombie")
    pid = wait_until_paused(points, "sales_zombie", "registered", 1, timeout=300)
    os.kill(pid, signal.SIGSTOP)  # its lease heartbeat stops with it
    try:
        marker(points, "sales_zombie", "registered", 1, "resume").touch()  # read after SIGCONT
        rival_run = run_of(cluster, backfill("sales_rival"))  # retries until the lease lapsed
        assert rival_run["state"] == "success", cluster.task_log_tails("sales_rival")
    finally:
        os.kill(pid, signal.SIGCONT)
    zombie_run = run_of(cluster, zombie)

    assert zombie_run["state"] == "failed"
    # Refused by the partition's fence, not only by the extract's age (its extract is older too,
    # so the watermark check alone would also stop it and hide a missing fence).
    zombie_log = cluster.task_log_tails("sales_zombie", lines=200)
    assert "refusing to overwrite daily_sales partition" in zombie_log, zombie_log
    audit = store.audit(DAY)
    assert audit is not None and audit.run_id == rival_run["run_id"]
    assert store.partition_checksum(DAY) == COMPLETE_CHECKSUM
    refused = [t for t in ledger.history(key) if t.event == "commit_refused"]
    assert [t.owner for t in refused] == [f"sales_zombie/{zombie_run['run_id']}/1"], ledger.history(key)
    assert ledger.item(key).state == "done"
