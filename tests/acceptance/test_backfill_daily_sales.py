"""``airflow backfill create`` of daily_sales through the real scheduler, on PostgreSQL.

Four local days around the 2021 spring-forward (a 23-hour day) are backfilled with four
runs at a time. The warehouse must equal a day-by-day pass partition by partition (row counts,
reject counts, checksums); backfilling again with ``--reprocess-behavior completed`` re-loads
every partition (newer fence tokens) and changes no checksum. Along the way the Deadline Alert
records each backfill day as suppressed (its 07:00 passed years ago), and the Asset wakes
sales_dashboard, whose page names the newest complete day.

The 730-day version is ``test_backfill_of_two_years_equals_day_by_day`` (``slow``) and
``benchmarks/bench_backfill.py``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
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
    standalone_cluster,
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


def backfill_alerts(cluster: Any, run_ids: set[str], timeout: float = 120.0) -> list[dict[str, Any]]:
    """The alert records of these runs, once the triggerer has written one for each."""
    path = Path(cluster.env["AIRFLOW_HOME"]) / "onceflow" / "alerts" / "missed_deadlines.jsonl"
    deadline = time.monotonic() + timeout
    mine: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        mine = [r for r in read_alert_records(path) if r["run_id"] in run_ids]
        if len(mine) >= len(run_ids):
            break
        time.sleep(1.0)
    return mine


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


def test_a_backfill_equals_the_day_by_day_pass_and_reprocessing_changes_no_checksum(
    postgres_url_factory: Callable[..., str],
    shop_orders: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    first, last = dt.date(2021, 3, 27), dt.date(2021, 3, 30)  # 4 days, 28 March has 23 hours
    days = local_days(first, last)
    shop, warehouse, reference = (postgres_url_factory(tag) for tag in ("shop", "warehouse", "reference"))
    # Three days before and after the window: refunds arrive up to 72 hours after the sale.
    shop_orders(shop, first - dt.timedelta(days=3), last + dt.timedelta(days=3), **GENERATOR)
    expected = day_by_day_pass(shop, reference, days, timezone=TZ)
    assert len(expected) == 4 and all(a.row_count > 0 for a in expected.values())

    with sales_cluster(request, tmp_path, shop, warehouse, slots=4) as cluster:
        backfill = create_backfill(cluster, "daily_sales", first, last, timezone=TZ, max_active_runs=4)
        runs = wait_for_backfill(cluster, backfill, timeout=900)
        # First the runs: a failed day would also (rightly) show as "not loaded" on the page.
        assert [r["state"] for r in runs] == ["success"] * 4, cluster.task_log_tails("daily_sales")
        loaded = partition_audits(warehouse, days)
        alerts = backfill_alerts(cluster, {r["run_id"] for r in runs})
        # The Asset woke the dashboard; its page names the newest complete day and the gap before
        # the backfilled days (30-day window, 4 days loaded).
        page = wait_for_page(
            tmp_path / "dashboard" / "index.html",
            "Complete through Tuesday 30 March 2021",
            "Not loaded (26 days of the window)",
            explain=lambda: (
                f"sales_dashboard runs: {cluster.dag_runs('sales_dashboard')}\n"
                f"{cluster.task_log_tails('sales_dashboard')}\n{cluster.log_tails()}"
            ),
        )
        again = create_backfill(
            cluster,
            "daily_sales",
            first,
            last,
            timezone=TZ,
            max_active_runs=4,
            reprocess_behavior="completed",
        )
        rerun = wait_for_backfill(cluster, again, timeout=900)
        logs = cluster.log_tails()

    assert sorted(loaded) == [d.isoformat() for d in days]
    assert {k: a[:3] for k, a in loaded.items()} == {k: a[:3] for k, a in expected.items()}
    assert {a.run_id for a in loaded.values()} == {r["run_id"] for r in runs}

    # Every backfill day missed its 07:00 long ago: recorded, but suppressed.
    assert sorted(a["data_day"] for a in alerts) == [d.isoformat() for d in days]
    assert all(a["suppressed"] and a["run_type"] == "backfill" for a in alerts)

    assert page.count('<tr class="missing">') == 26

    # Backfilling again re-ran every day (same run ids, newer fence tokens): no checksum moved.
    assert [(r["run_id"], r["state"]) for r in rerun] == [(r["run_id"], "success") for r in runs], logs
    reloaded = partition_audits(warehouse, days)
    assert {k: a.checksum for k, a in reloaded.items()} == {k: a.checksum for k, a in loaded.items()}
    assert all(reloaded[k].fence_token > loaded[k].fence_token for k in loaded), "every day was re-loaded"


@pytest.mark.slow
def test_backfill_of_two_years_equals_day_by_day(
    postgres_url_factory: Callable[..., str],
    shop_orders: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The issue's done-when: 730 days, bounded max-active-runs, per-partition equality, idempotent redo."""
    first = dt.date(2021, 1, 1)
    last = first + dt.timedelta(days=729)
    days = local_days(first, last)
    shop, warehouse, reference = (postgres_url_factory(tag) for tag in ("shop2y", "wh2y", "ref2y"))
    shop_orders(shop, first - dt.timedelta(days=3), last + dt.timedelta(days=3), **GENERATOR)
    expected = day_by_day_pass(shop, reference, days, timezone=TZ)

    with sales_cluster(request, tmp_path, shop, warehouse, slots=4) as cluster:
        backfill = create_backfill(cluster, "daily_sales", first, last, timezone=TZ, max_active_runs=8)
        runs = wait_for_backfill(cluster, backfill, timeout=4 * 3600, poll=10.0)
        loaded = partition_audits(warehouse, days)
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

    assert len(runs) == 730 and {r["state"] for r in runs} == {"success"}
    assert {k: a[:3] for k, a in loaded.items()} == {k: a[:3] for k, a in expected.items()}
    assert {r["state"] for r in rerun} == {"success"}
    reloaded = partition_audits(warehouse, days)
    assert {k: a.checksum for k, a in reloaded.items()} == {k: a.checksum for k, a in loaded.items()}
