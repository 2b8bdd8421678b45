"""Backfills of daily_sales through a real scheduler, and the day-by-day pass they must equal.

Used by ``tests/acceptance/test_backfill_daily_sales.py`` and ``benchmarks/bench_backfill.py``;
usable for your own DAGs the same way:

* :func:`backfill_window` turns local days into ``--from-date``/``--to-date`` values. Plain dates
  are read as UTC midnight, so in a timezone east of UTC ``--from-date 2024-10-20`` silently
  skips local 20 October (its logical date is 19 October 22:00 UTC).
* :func:`create_backfill` runs ``airflow backfill create`` and :func:`wait_for_backfill` waits
  until the scheduler marks that backfill complete.
* :func:`day_by_day_pass` loads each day with the same hook, cleaning and fenced overwrite the
  DAG uses, one day after the other, outside Airflow, and returns what the warehouse then holds.
* :func:`stored_partitions` reads each partition **back from the table** (row count, net total,
  rejects, and the checksum of the stored rows), so two warehouses are compared by what they
  hold, not by what a loader computed before writing; :func:`partition_audits` reads
  ``load_audit`` (fence tokens, run ids).
* :func:`reference_totals` computes each day's row count, reject count and net total with plain
  SQL over the shop database (``testing/sql/sales_reference.sql``), an independent path that
  shares no code with the cleaning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from typing import TYPE_CHECKING, Any, NamedTuple
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from onceflow.testing.airflow_cluster import AirflowCluster


class StoredPartition(NamedTuple):
    """One partition as read back from the warehouse (not what the loader computed)."""

    row_count: int
    reject_count: int
    net_cents: int
    checksum: str


class DayTotals(NamedTuple):
    """One business day computed by plain SQL over the shop (:func:`reference_totals`)."""

    source_rows: int
    reject_count: int
    row_count: int
    net_cents: int


class PartitionAudit(NamedTuple):
    """What ``load_audit`` says about one partition."""

    row_count: int
    reject_count: int
    checksum: str
    fence_token: int
    run_id: str


def local_days(first: dt.date, last: dt.date) -> list[dt.date]:
    """Every day from ``first`` to ``last``, both included."""
    return [first + dt.timedelta(days=n) for n in range((last - first).days + 1)]


def backfill_window(first: dt.date, last: dt.date, timezone: str) -> tuple[str, str]:
    """``--from-date``/``--to-date`` values selecting exactly the local days ``first..last``.

    Both are the local midnights that start those days (the logical dates of their runs), with
    their UTC offsets, so DST and the CLI's UTC default cannot shift the window.
    """
    from onceflow.sales.partitions import local_midnight_utc

    tz = ZoneInfo(timezone)  # a repeated midnight: the second one, where Airflow's runs start
    start, end = (local_midnight_utc(day, tz).astimezone(tz) for day in (first, last))
    return start.isoformat(), end.isoformat()


def create_backfill(
    cluster: AirflowCluster,
    dag_id: str,
    first: dt.date,
    last: dt.date,
    *,
    timezone: str,
    max_active_runs: int,
    reprocess_behavior: str | None = None,
) -> int:
    """``airflow backfill create`` for the local days ``first..last``; returns the backfill id."""
    start, end = backfill_window(first, last, timezone)
    before = _latest_backfill_id(cluster, dag_id)
    args = [
        "backfill",
        "create",
        "--dag-id",
        dag_id,
        "--from-date",
        start,
        "--to-date",
        end,
        "--max-active-runs",
        str(max_active_runs),
    ]
    if reprocess_behavior:
        args += ["--reprocess-behavior", reprocess_behavior]
    # On a SQLite metadata DB the CLI holds the write lock from each transaction's start
    # (AirflowCluster.cli: onceflow.sqlite_cli), so "database is locked" means it waited 60 s for
    # another writer and made no run. Retried only when no backfill came of it; one that
    # was created stands (or fails) as it is.
    for attempt in range(6):
        proc = cluster.cli(*args, check=False)
        locked = "database is locked" in proc.stderr + proc.stdout
        if (
            proc.returncode == 0
            or not locked
            or attempt == 5
            or _latest_backfill_id(cluster, dag_id) != before
        ):
            break
        time.sleep(1.0 + attempt)
    if proc.returncode != 0:
        raise RuntimeError(
            f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    backfill_id = _latest_backfill_id(cluster, dag_id)
    if backfill_id is None or backfill_id == before:
        raise RuntimeError(f"airflow backfill create made no backfill for {dag_id} {start}..{end}")
    return backfill_id


def _latest_backfill_id(cluster: AirflowCluster, dag_id: str) -> int | None:
    rows = cluster.query("SELECT MAX(id) AS id FROM backfill WHERE dag_id = :dag_id", dag_id=dag_id)
    return rows[0]["id"] if rows and rows[0]["id"] is not None else None


def wait_for_backfill(
    cluster: AirflowCluster, backfill_id: int, *, timeout: float = 900.0, poll: float = 2.0
) -> list[dict[str, Any]]:
    """Wait until the scheduler completes backfill ``backfill_id``; return its runs by logical date."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = cluster.query("SELECT completed_at FROM backfill WHERE id = :id", id=backfill_id)
        if rows and rows[0]["completed_at"] is not None:
            return backfill_runs(cluster, backfill_id)
        time.sleep(poll)
    runs = backfill_runs(cluster, backfill_id)
    states = sorted({str(r["state"]) for r in runs})
    raise TimeoutError(
        f"backfill {backfill_id} not complete after {timeout}s ({len(runs)} runs, states {states})\n"
        f"{cluster.log_tails()}"
    )


def backfill_runs(cluster: AirflowCluster, backfill_id: int) -> list[dict[str, Any]]:
    """The DAG runs of a backfill, oldest logical date first."""
    return cluster.query(
        "SELECT r.run_id, r.state, r.logical_date, r.start_date, r.end_date FROM backfill_dag_run b "
        "JOIN dag_run r ON r.id = b.dag_run_id WHERE b.backfill_id = :id ORDER BY r.logical_date",
        id=backfill_id,
    )


def partition_audits(
    url: str, days: Sequence[dt.date], table: str = "daily_sales"
) -> dict[str, PartitionAudit]:
    """``load_audit`` of ``table`` for ``days`` (missing partitions are absent), by partition key."""
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore

    engine = make_engine(url)
    try:
        store = PartitionStore(engine, table)
        found = {}
        for day in days:
            audit = store.audit(day)
            if audit is not None:
                found[audit.partition_key] = PartitionAudit(
                    audit.row_count, audit.reject_count, audit.checksum, audit.fence_token, audit.run_id
                )
        return found
    finally:
        engine.dispose()


def stored_partitions(
    url: str, days: Sequence[dt.date], table: str = "daily_sales"
) -> dict[str, StoredPartition]:
    """What the warehouse holds for ``days`` (partitions without an audit row are absent).

    Rows, net total and checksum come from the sales table itself
    (``PartitionStore.partition_checksum`` hashes the rows read back), rejects from the rejects
    table; ``load_audit`` only says which partitions were loaded.
    """
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.sales.schema import SALES_COLUMNS

    net = SALES_COLUMNS.index("net_cents")
    engine = make_engine(url)
    try:
        store = PartitionStore(engine, table)
        found = {}
        for day in days:
            if store.audit(day) is None:
                continue
            rows = store.partition_rows(day)
            found[day.isoformat()] = StoredPartition(
                row_count=len(rows),
                reject_count=len(store.partition_rejects(day)),
                net_cents=sum(int(r[net]) for r in rows),
                checksum=store.partition_checksum(day),
            )
        return found
    finally:
        engine.dispose()


def reference_totals(shop_url: str, days: Sequence[dt.date], *, timezone: str) -> dict[str, DayTotals]:
    """Each day's expected totals by plain SQL over the shop's ``orders`` (PostgreSQL only).

    The query restates the cleaning rules (rejects, dedupe, rates, half-even cents, netting) in
    SQL; it does not use :mod:`onceflow.sales.clean`, so a bug there cannot hide in both.
    """
    from importlib import resources

    import sqlalchemy as sa

    from onceflow.sales.engine import make_engine
    from onceflow.sales.partitions import day_bounds_utc

    text = resources.files("onceflow.testing").joinpath("sql", "sales_reference.sql").read_text("utf-8")
    query = sa.text(text.split("-- name: day_totals_postgresql", 1)[1])
    engine = make_engine(shop_url)
    if engine.dialect.name != "postgresql":
        engine.dispose()
        raise ValueError(f"reference_totals runs on PostgreSQL, not {engine.dialect.name}")
    try:
        totals = {}
        with engine.connect() as conn:
            for day in days:
                start, end = (
                    b.astimezone(dt.timezone.utc).replace(tzinfo=None) for b in day_bounds_utc(day, timezone)
                )
                row = conn.execute(query, {"start_utc": start, "end_utc": end}).one()
                totals[day.isoformat()] = DayTotals(*(int(v) for v in row))
        return totals
    finally:
        engine.dispose()


def day_by_day_pass(
    shop_url: str,
    warehouse_url: str,
    days: Sequence[dt.date],
    *,
    timezone: str,
    table: str = "daily_sales",
    reporting_currency: str = "EUR",
) -> dict[str, StoredPartition]:
    """Load ``days`` one after the other into ``warehouse_url`` with the DAG's own building blocks.

    Read [D 00:00, D+1 00:00) local from the shop, clean, overwrite the partition under a fresh
    lease: what one ``daily_sales`` run does, minus Airflow. Returns :func:`stored_partitions`.
    """
    from airflow.sdk import Connection

    from onceflow.hooks.warehouse import ShopDbHook
    from onceflow.sales.clean import PROCESSING_VERSION, clean_orders
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.sales.partitions import day_bounds_utc

    shop = ShopDbHook()
    # The hook the DAG uses, handed its connection directly instead of looking one up.
    shop.connection = Connection(
        conn_id=shop.conn_id, conn_type="postgres", extra=json.dumps({"sqlalchemy_url": shop_url})
    )
    warehouse = make_engine(warehouse_url)
    try:
        store = PartitionStore(warehouse, table)
        store.create_schema()
        for day in days:
            start, end = day_bounds_utc(day, timezone)
            result = clean_orders(
                shop.read_interval(start, end), partition=day, reporting_currency=reporting_currency
            )
            lease = store.acquire_lease(day, run_id=f"day_by_day__{day.isoformat()}", try_number=1)
            store.overwrite(lease, result.rows, result.rejects, processing_version=PROCESSING_VERSION)
    finally:
        shop.engine.dispose()
        warehouse.dispose()
    return stored_partitions(warehouse_url, days, table)


@contextlib.contextmanager
def standalone_cluster(
    workdir: Path,
    dags_folder: Path,
    *,
    env: dict[str, str] | None = None,
    pools: dict[str, int] | None = None,
    parallelism: int = 8,
    use_postgres: bool = True,
    executor: str = "local",
    celery: dict[str, Any] | None = None,
) -> Iterator[AirflowCluster]:
    """A migrated Airflow installation and its running cluster, outside pytest (benchmarks).

    The metadata DB is a fresh PostgreSQL database by default; everything is removed on exit.
    Airflow is not imported into the calling process: pools are set through the CLI.
    ``executor="celery"`` starts a :class:`~onceflow.testing.celery_cluster.CeleryCluster`
    (``celery`` holds its options: ``workers``, ``worker_concurrency``, ...).
    """
    from onceflow.testing.airflow_cluster import AirflowCluster
    from onceflow.testing.airflow_env import prepare
    from onceflow.testing.celery_cluster import CeleryCluster

    airflow_env = prepare(
        dags_folder=dags_folder,
        plugins_folder=workdir / "plugins",
        use_postgres=use_postgres,
        home=workdir / "home",
    )
    # prepare() decided the metadata DB: its SQLite file lives in the home it made
    sqlite_metadata = None if airflow_env.is_postgres else airflow_env.home / "airflow.db"
    if sqlite_metadata is not None:
        # As `make run` sets it up: a longer lock wait, and write-ahead logging after the migration
        # (eight task processes and the api-server write at once).
        from onceflow.local_run import sqlite_metadata_settings

        sqlite_metadata_settings(airflow_env.variables)
    try:
        airflow_env.migrate()
        if sqlite_metadata is not None:
            from onceflow.sqlite_metadata import use_write_ahead_log

            use_write_ahead_log(sqlite_metadata)
        cluster = (
            CeleryCluster(
                airflow_env.variables,
                workdir / "cluster",
                dags_folder=dags_folder,
                env=env,
                parallelism=parallelism,
                **(celery or {}),
            )
            if executor == "celery"
            else AirflowCluster(
                airflow_env.variables,
                workdir / "cluster",
                dags_folder=dags_folder,
                env=env,
                parallelism=parallelism,
            )
        )
        with cluster:
            for name, slots in (pools or {}).items():
                cluster.cli("pools", "set", name, str(slots), "onceflow benchmark pool")
            yield cluster
    finally:
        airflow_env.cleanup()
