"""kill -9 during a partition load, and a zombie attempt, with real processes and real databases.

A worker subprocess runs the real load code and pauses at a named point by writing a file and
waiting; the test then SIGKILLs it (or lets it resume) and inspects the warehouse. The same crash
with a plain append load shows the duplicates that overwrite-by-partition avoids.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from onceflow.sales.clean import PROCESSING_VERSION
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionStore
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from pathlib import Path

DAY = dt.date(2024, 3, 31)  # 23 hours in Europe/Amsterdam
CONFIG = GeneratorConfig(seed=9, orders_per_day=150)
CUTOFF = "2024-03-31T22:00:00"  # before the late rows arrived
NIGHTLY = clean_day(DAY, CONFIG, ingested_before=dt.datetime.fromisoformat(CUTOFF))
COMPLETE = clean_day(DAY, CONFIG)
RUN = "manual__rerun"

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


def test_a_zombie_process_with_an_old_try_is_refused_at_commit(
    store: PartitionStore, sales_db_url: str, tmp_path: Path
) -> None:
    load_nightly(store)
    signals = tmp_path / "signals"
    zombie = start_worker(sales_db_url, "overwrite", "acquired", signals, try_number=1)
    wait_until_paused(zombie, signals, "acquired")

    # Airflow gave up on try 1 (its heartbeat stopped) and ran try 2, which committed.
    lease = store.acquire_lease(DAY, run_id=RUN, try_number=2)
    newest = store.overwrite(lease, NIGHTLY.rows, None, processing_version="v-try2").checksum

    (signals / "resume").write_text("go")  # the zombie wakes up and tries to commit
    _, stderr = zombie.communicate(timeout=120)
    assert zombie.returncode == 3, stderr
    assert "REFUSED" in stderr and "try 1 holds fence token" in stderr
    assert store.partition_checksum(DAY) == newest
    assert store.audit(DAY).processing_version == "v-try2"  # type: ignore[union-attr]
