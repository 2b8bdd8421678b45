"""``airflow backfill create`` of daily_sales through the real scheduler, on PostgreSQL.

Two short backfills, two local days across each 2021 DST change (a 23-hour and a 25-hour day).
What the warehouse holds, read back from the table (row counts, rejects, net totals and the
checksum of the stored rows), must equal a day-by-day pass of the DAG's building blocks, and the
row counts and net totals must equal plain SQL over the shop (no shared cleaning code).
Backfilling again with ``--reprocess-behavior completed`` re-loads every partition (newer fence
tokens) and changes no stored row. Along the way no backfill run gets a deadline (their 07:00
passed long before they ran: no "Missed" row, no alert), and the Asset wakes sales_dashboard,
whose page names the newest complete day.

The 730-day version is ``test_backfill_of_two_years_equals_day_by_day`` (``slow``) and
``benchmarks/bench_backfill.py``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.notifications.deadline import read_alert_records
from onceflow.testing.sales_backfill import (
    create_backfill,
    day_by_day_pass,
    local_days,
    partition_audits,
    reference_totals,
    standalone_cluster,
    stored_partitions,
    wait_for_backfill,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = [pytest.mark.real_airflow, pytest.mark.postgres]

DAGS = Path(__file__).resolve().parents[2] / "dags"
TZ = "Europe/Amsterdam"
GENERATOR = {"seed": 73, "orders_per_day": 60, "timezone": TZ}


def connection(url: str) -> str:
    return json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}})


@contextlib.contextmanager
def sales_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, shop: str, warehouse: str, *, slots: int
) -> Iterator[Any]:
    """daily_sales and sales_dashboard on a real cluster, pointed at PostgreSQL.

    The metadata DB is PostgreSQL too: the session's when it is (CI), else a fresh one, because
    a backfill's bulk inserts and the scheduler lock each other out of SQLite ("database is
    locked" from ``airflow backfill create``).
    """
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("daily_sales.py", "sales_dashboard.py"):
        shutil.copy(DAGS / name, dags / name)
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": connection(shop),
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": connection(warehouse),
        # Several task processes lease at once: the ledger on PostgreSQL, as in production.
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": connection(request.getfixturevalue("postgres_url_factory")("ledger")),
        "ONCEFLOW_BUSINESS_TZ": TZ,
        "ONCEFLOW_SALES_STAGING_DIR": str(tmp_path / "staging"),
        "ONCEFLOW_DASHBOARD_DIR": str(tmp_path / "dashboard"),
        "ONCEFLOW_SALES_RETRIES": "0",
        # A start date in the future: no scheduled run appears, only the backfill's.
        "ONCEFLOW_SALES_START_DATE": "2099-01-01",
    }
    pools = {"onceflow_warehouse": slots}
    with contextlib.ExitStack() as stack:
        if request.getfixturevalue("airflow_env").is_postgres:
            cluster = request.getfixturevalue("airflow_cluster_factory")(
                dags_folder=dags, env=env, pools=pools
            )
        else:
            cluster = stack.enter_context(
                standalone_cluster(tmp_path / "airflow", dags, env=env, pools=pools)
            )
        cluster.wait_for_dag("daily_sales")
        cluster.wait_for_dag("sales_dashboard")
        yield cluster


def alert_file(cluster: Any) -> Path:
    """The missed-deadline records of the cluster's DAGs (the notifier's default file)."""
    return Path(cluster.env["AIRFLOW_HOME"]) / "onceflow" / "alerts" / "missed_deadlines.jsonl"


def wait_for_page(page: Path, *texts: str, timeout: float = 600.0, explain: Callable[[], str] = str) -> str:
    """The page once it contains every text (renders queued during the backfill may lag behind)."""
    deadline = time.monotonic() + timeout
    content = ""
    while time.monotonic() < deadline:
        content = page.read_text(encoding="utf-8") if page.exists() else ""
        if all(t in content for t in texts):
            return content
        time.sleep(1.0)
    raise AssertionError(
        f"{page} never contained all of {texts!r}; last content:\n{content[:3000]}\n{explain()}"
    )


# Two short windows, one across each 2021 DST change: 28 March has 23 hours, 31 October 25.
WINDOWS = ((dt.date(2021, 3, 27), dt.date(2021, 3, 28)), (dt.date(2021, 10, 30), dt.date(2021, 10, 31)))


def test_a_backfill_equals_the_day_by_day_pass_and_reprocessing_changes_no_checksum(
    postgres_url_factory: Callable[..., str],
    shop_orders: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    days = [d for first, last in WINDOWS for d in local_days(first, last)]
    keys = [d.isoformat() for d in days]
    shop, warehouse, reference = (postgres_url_factory(tag) for tag in ("shop", "warehouse", "reference"))
    for first, last in WINDOWS:
        # Three days before and after: refunds arrive up to 72 hours after the sale.
        shop_orders(shop, first - dt.timedelta(days=3), last + dt.timedelta(days=3), **GENERATOR)
    # Two references: the DAG's building blocks day by day (read back from the table), and plain
    # SQL over the shop that shares no code with the cleaning (counts and net totals).
    expected = day_by_day_pass(shop, reference, days, timezone=TZ)
    by_sql = reference_totals(shop, days, timezone=TZ)
    assert sorted(expected) == keys and all(p.row_count > 0 for p in expected.values())
    assert {k: (p.row_count, p.reject_count, p.net_cents) for k, p in expected.items()} == {
        k: (t.row_count, t.reject_count, t.net_cents) for k, t in by_sql.items()
    }

    with sales_cluster(request, tmp_path, shop, warehouse, slots=4) as cluster:
        runs = []
        for first, last in WINDOWS:  # one backfill at a time per DAG
            backfill = create_backfill(cluster, "daily_sales", first, last, timezone=TZ, max_active_runs=4)
            runs += wait_for_backfill(cluster, backfill, timeout=900)
        # First the runs: a failed day would also (rightly) show as "not loaded" on the page.
        assert [r["state"] for r in runs] == ["success"] * len(days), cluster.task_log_tails("daily_sales")
        loaded = stored_partitions(warehouse, days)
        audits = partition_audits(warehouse, days)
        # Deadlines are stored when a run is created: none for these runs means none will fire.
        backfill_deadlines = cluster.query(
            "SELECT r.run_id FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id WHERE r.run_type = :t",
            t="backfill",
        )
        alerts = [
            r for r in read_alert_records(alert_file(cluster)) if r["run_id"] in {x["run_id"] for x in runs}
        ]
        # The Asset woke the dashboard; its page names the newest complete day and the gap before
        # it (30-day window ending 31 October, 2 days loaded in it).
        page = wait_for_page(
            tmp_path / "dashboard" / "index.html",
            "Complete through Sunday 31 October 2021",
            "Not loaded (28 days of the window)",
            explain=lambda: (
                f"sales_dashboard runs: {cluster.dag_runs('sales_dashboard')}\n"
                f"{cluster.task_log_tails('sales_dashboard')}\n{cluster.log_tails()}"
            ),
        )
        rerun = []
        for first, last in WINDOWS:
            again = create_backfill(
                cluster,
                "daily_sales",
                first,
                last,
                timezone=TZ,
                max_active_runs=4,
                reprocess_behavior="completed",
            )
            rerun += wait_for_backfill(cluster, again, timeout=900)
        logs = cluster.log_tails()

    # What the table holds equals both references, partition by partition.
    assert sorted(loaded) == keys
    assert loaded == expected
    assert {k: (p.row_count, p.net_cents) for k, p in loaded.items()} == {
        k: (t.row_count, t.net_cents) for k, t in by_sql.items()
    }
    # The audit rows describe the stored rows, and name the backfill runs.
    assert {k: a.checksum for k, a in audits.items()} == {k: p.checksum for k, p in loaded.items()}
    assert {a.run_id for a in audits.values()} == {r["run_id"] for r in runs}

    # Every backfill day's 07:00 passed long ago: no deadline, so nothing "missed" to record.
    # (The 07:00-local deadlines of the 23- and 25-hour days: tests/integration/test_deadline_dst.py.)
    assert backfill_deadlines == [] and alerts == []

    assert page.count('<tr class="missing">') == 28

    # Backfilling again re-ran every day (same run ids, newer fence tokens): the stored rows are
    # the same.
    assert [(r["run_id"], r["state"]) for r in rerun] == [(r["run_id"], "success") for r in runs], logs
    assert stored_partitions(warehouse, days) == loaded
    reloaded = partition_audits(warehouse, days)
    assert all(reloaded[k].fence_token > audits[k].fence_token for k in keys), "every day was re-loaded"


@pytest.mark.slow
# two backfills of up to 4 h each (about 25 min each, idle): not pytest-timeout's 900 s
@pytest.mark.timeout(9 * 3600)
def test_backfill_of_two_years_equals_day_by_day(
    postgres_url_factory: Callable[..., str],
    shop_orders: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The issue's done-when: 730 days, bounded max-active-runs, per-partition equality, idempotent redo.

    ``ONCEFLOW_BACKFILL_DAYS`` shortens it (e.g. 5) to check the path without the two hours.
    """
    first = dt.date(2021, 1, 1)
    last = first + dt.timedelta(days=int(os.environ.get("ONCEFLOW_BACKFILL_DAYS", "730")) - 1)
    days = local_days(first, last)
    shop, warehouse, reference = (postgres_url_factory(tag) for tag in ("shop2y", "wh2y", "ref2y"))
    shop_orders(shop, first - dt.timedelta(days=3), last + dt.timedelta(days=3), **GENERATOR)
    expected = day_by_day_pass(shop, reference, days, timezone=TZ)
    by_sql = reference_totals(shop, days, timezone=TZ)

    with sales_cluster(request, tmp_path, shop, warehouse, slots=4) as cluster:
        backfill = create_backfill(cluster, "daily_sales", first, last, timezone=TZ, max_active_runs=8)
        runs = wait_for_backfill(cluster, backfill, timeout=4 * 3600, poll=10.0)
        loaded = stored_partitions(warehouse, days)
        audits = partition_audits(warehouse, days)
        again = create_backfill(
            cluster,
            "daily_sales",
            first,
            last,
            timezone=TZ,
            max_active_runs=8,
            reprocess_behavior="completed",
        )
        rerun = wait_for_backfill(cluster, again, timeout=4 * 3600, poll=10.0)

    assert len(runs) == len(days) and {r["state"] for r in runs} == {"success"}
    assert loaded == expected
    assert {k: (p.row_count, p.net_cents) for k, p in loaded.items()} == {
        k: (t.row_count, t.net_cents) for k, t in by_sql.items()
    }
    assert len(rerun) == len(days) and {r["state"] for r in rerun} == {"success"}
    assert stored_partitions(warehouse, days) == expected
    # the reprocess really re-loaded every day (a newer fence token), not only left it alone
    reloaded = partition_audits(warehouse, days)
    assert len(reloaded) == len(days)
    assert all(reloaded[k].fence_token > audits[k].fence_token for k in reloaded), {
        k: (audits[k].fence_token, a.fence_token)
        for k, a in reloaded.items()
        if a.fence_token <= audits[k].fence_token
    }
