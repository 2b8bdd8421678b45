"""The distributed topology (CeleryExecutor on Redis, two HA schedulers, two workers that share no
disk) as real processes, with a scheduler and a worker SIGKILLed mid-flight and restarted.

* ``test_tasks_spread_over_private_workers_and_survive_kills``: mapped probe tasks land on both
  workers, each of which sees only its own ``AIRFLOW_HOME`` and ``TMPDIR``; a worker killed with
  running tasks (its task processes die with it) and a scheduler killed at the same time: the
  other scheduler goes on, the lost tasks are retried, nothing stays queued.
* ``test_a_30_day_backfill_survives_a_killed_scheduler_and_worker`` (slow): every stored
  partition equals the day-by-day pass; extract, clean and load hand each day over through
  ``onceflow_storage`` only (no staging folder on any worker's disk).
* ``test_claimed_rows_are_processed_once_despite_kills``: rows claimed by ``sheet_claim`` and
  run through every step of ``article_pipeline`` on main: no row claimed twice, no article
  published twice, nothing queued forever (20 rows here, 200 in the ``slow`` variant).

The daily_sales and article tests run twice, with ``onceflow_storage`` on ``file://`` (one folder
standing for the bucket every worker reaches) and on a fake GCS bucket (``fake-gcs-server``; the
workers are separate processes, so they get the emulator through the connection's ``endpoint``
extra and the bucket in ``base``). Nothing is mocked: Redis, PostgreSQL, Airflow's own processes,
the Sheets emulator.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import create_engine, text

from onceflow.sheets.model import Snapshot
from onceflow.testing.processes import session_members
from onceflow.testing.sales_backfill import (
    backfill_runs,
    create_backfill,
    day_by_day_pass,
    local_days,
    reference_totals,
    stored_partitions,
    wait_for_backfill,
)

if TYPE_CHECKING:
    from onceflow.testing.article_site import ArticleSite
    from onceflow.testing.celery_cluster import CeleryCluster
    from onceflow.testing.gcs_fixtures import FakeGcs
    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = [pytest.mark.real_airflow, pytest.mark.postgres]

REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
TERMINAL = {"success", "failed", "skipped", "upstream_failed", "removed"}

PROBE = textwrap.dedent(
    '''
    """Mapped tasks that report where they ran (the worker's private home and temp folder)."""
    import os
    import tempfile
    import time
    from datetime import timedelta

    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
         max_active_tasks=16, default_args={"retries": 2, "retry_delay": timedelta(seconds=5)})
    def celery_probe():
        @task
        def where(i: int) -> dict:
            time.sleep(8)
            return {"home": os.environ["AIRFLOW_HOME"], "tmp": tempfile.gettempdir(), "i": i}

        where.expand(i=list(range(16)))

    celery_probe()
    '''
)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, cluster: CeleryCluster) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout}s\n{cluster.log_tails()}")


def running_on(
    cluster: CeleryCluster, worker: str, dag_id: str, runs: Callable[[], set[str]] | None = None
) -> list[dict[str, Any]]:
    """Running task instances whose task process belongs to ``worker``'s process tree (of the
    runs ``runs()`` names, when given)."""
    members = set(session_members(cluster.pid(worker)))
    rows = cluster.query(
        "SELECT task_id, run_id, map_index, pid FROM task_instance "
        "WHERE dag_id = :dag_id AND state = 'running' AND pid IS NOT NULL",
        dag_id=dag_id,
    )
    ours = runs() if runs is not None else None
    return [r for r in rows if r["pid"] in members and (ours is None or r["run_id"] in ours)]


def non_terminal(cluster: CeleryCluster, dag_id: str) -> list[dict[str, Any]]:
    return [ti for ti in cluster.task_instances(dag_id) if ti["state"] not in TERMINAL]


def kill_mid_flight(
    cluster: CeleryCluster,
    dag_id: str,
    *,
    runs: Callable[[], set[str]] | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Once worker-1 runs a task of ``dag_id`` (of ``runs()``, when given): SIGKILL scheduler-1
    and worker-1 (with its task processes), then restart both. Returns what was hit."""
    hit = wait_until(
        lambda: running_on(cluster, "worker-1", dag_id, runs), timeout, "a task on worker-1", cluster
    )
    scheduler_jobs = len(cluster.scheduler_jobs())
    killed = {"scheduler": cluster.kill("scheduler-1"), "worker": cluster.kill("worker-1"), "tasks": hit}
    time.sleep(5)  # both stay dead a moment: the survivors carry on alone
    cluster.relaunch("scheduler-1")
    cluster.relaunch("worker-1")
    assert len(cluster.scheduler_jobs()) == scheduler_jobs + 1, "the restarted scheduler has a new job"
    return killed


@pytest.mark.slow  # 139 s idle; make test stays under 40 min (the Celery tests run in make test-slow)
def test_tasks_spread_over_private_workers_and_survive_kills(
    airflow_cluster_factory: Callable[..., Any], tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "celery_probe.py").write_text(PROBE)
    cluster: CeleryCluster = airflow_cluster_factory(
        dags_folder=dags, executor="celery", celery={"worker_concurrency": 3}
    )
    homes = {cluster.worker_home(name) for name in cluster.worker_names}
    assert len(homes) == 2

    first = cluster.trigger("celery_probe")
    killed = kill_mid_flight(cluster, "celery_probe")
    assert cluster.wait_for_run("celery_probe", first, timeout=600) == "success", cluster.task_log_tails(
        "celery_probe"
    )
    second = cluster.trigger("celery_probe")
    assert cluster.wait_for_run("celery_probe", second, timeout=600) == "success"

    tis = cluster.task_instances("celery_probe")
    assert len(tis) == 32 and {ti["state"] for ti in tis} == {"success"}, tis
    # the tasks that were running on the killed worker ran again
    retried = {(ti["run_id"], ti["map_index"]) for ti in tis if ti["try_number"] > 1}
    assert {(t["run_id"], t["map_index"]) for t in killed["tasks"]} <= retried, (killed, tis)
    # each task saw one worker's private home and temp folder; both workers did work
    reports = [
        r["value"] if isinstance(r["value"], dict) else json.loads(r["value"])
        for r in cluster.query(
            "SELECT value FROM xcom WHERE dag_id = 'celery_probe' AND key = 'return_value'"
        )
    ]
    assert len(reports) == 32
    assert {Path(r["home"]) for r in reports} == homes
    assert all(Path(r["tmp"]).parent == Path(r["home"]).parent for r in reports), reports
    # two scheduler processes were alive together: HA mode on one metadata DB
    jobs = cluster.scheduler_jobs()
    assert len(jobs) == 3, jobs
    # the broker keys are this cluster's own (prefixed), and go with it
    assert any(key.endswith(f"_kombu.binding.{cluster.queue}") for key in cluster.broker_keys())
    cluster.stop()
    assert cluster.leftover_pids() == [] and cluster.broker_keys() == []


# -- onceflow_storage: what the workers share instead of a disk -----------------------------------

STORAGES = ["file", "gcs"]


@dataclasses.dataclass
class SharedStorage:
    """The ``onceflow_storage`` of a cluster, and an independent reader of what it holds."""

    root: str  # file:///... or gs://bucket
    #: stored names under ``prefix`` of the root, relative to it (temporary files included)
    names: Callable[[str], list[str]]
    endpoint: str | None = None

    def connection(self, **extra: Any) -> str:
        """``AIRFLOW_CONN_ONCEFLOW_STORAGE``: ``base`` is the root, ``extra`` added."""
        extras = {"base": self.root, **extra}
        if self.endpoint is not None:
            extras["endpoint"] = self.endpoint
        return json.dumps({"conn_type": "generic", "extra": extras})


def shared_storage(storage: str, request: pytest.FixtureRequest, tmp_path: Path) -> SharedStorage:
    """A ``file://`` folder standing for the bucket, or a fresh bucket on the fake GCS server."""
    if storage == "file":
        root = tmp_path / "storage"

        def files(prefix: str) -> list[str]:
            folder = root / prefix
            if not folder.exists():
                return []
            return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

        return SharedStorage(root.as_uri(), files)
    fake_gcs: FakeGcs = request.getfixturevalue("fake_gcs")
    bucket = fake_gcs.bucket()

    def objects(prefix: str) -> list[str]:
        return sorted(n[len(prefix) + 1 :] for n in fake_gcs.objects(bucket, prefix=prefix + "/"))

    return SharedStorage(f"gs://{bucket}", objects, endpoint=fake_gcs.url)


def local_staging(cluster: CeleryCluster) -> list[Path]:
    """Staging files on the workers' own disks (the old default folders): there must be none."""
    found: list[Path] = []
    for name in cluster.worker_names:
        onceflow_home = cluster.worker_home(name) / "onceflow"
        found += [
            p for sub in ("staging", "storage") for p in (onceflow_home / sub).rglob("*") if p.is_file()
        ]
    return found


# -- daily_sales: a 30-day backfill ----------------------------------------------------------------

TZ = "Europe/Amsterdam"
GENERATOR = {"seed": 91, "orders_per_day": 60, "timezone": TZ}  # >= 60: two bad rows a day stay under 5%


def pg_connection(url: str) -> str:
    return json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": url}})


def succeeded_runs(cluster: CeleryCluster, backfill: int) -> int:
    """Runs of this backfill that succeeded (the session's metadata DB holds other tests' runs)."""
    return sum(1 for r in backfill_runs(cluster, backfill) if r["state"] == "success")


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("storage", STORAGES)
def test_a_30_day_backfill_survives_a_killed_scheduler_and_worker(
    storage: str,
    request: pytest.FixtureRequest,
    airflow_cluster_factory: Callable[..., Any],
    postgres_url_factory: Callable[..., str],
    shop_orders: Callable[..., Any],
    tmp_path: Path,
) -> None:
    # 30 local days across a March DST change; each storage its own days, because both variants
    # share the session's metadata DB: a second backfill of the same days would find them done.
    first = {"file": dt.date(2021, 3, 10), "gcs": dt.date(2022, 3, 9)}[storage]
    days = local_days(first, first + dt.timedelta(days=29))
    shop, warehouse, reference, ledger = (
        postgres_url_factory(tag) for tag in ("cshop", "cwarehouse", "creference", "cledger")
    )
    shop_orders(shop, first - dt.timedelta(days=3), days[-1] + dt.timedelta(days=3), **GENERATOR)
    expected = day_by_day_pass(shop, reference, days, timezone=TZ)
    by_sql = reference_totals(shop, days, timezone=TZ)

    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO_DAGS / "daily_sales.py", dags / "daily_sales.py")
    shared = shared_storage(storage, request, tmp_path)
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHOP_DB": pg_connection(shop),
        "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": pg_connection(warehouse),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": pg_connection(ledger),
        "ONCEFLOW_BUSINESS_TZ": TZ,
        # The workers share no disk: the staging between extract, clean and load goes through
        # onceflow_storage (no ONCEFLOW_SALES_STAGING_DIR).
        "AIRFLOW_CONN_ONCEFLOW_STORAGE": shared.connection(),
        "ONCEFLOW_SALES_START_DATE": "2099-01-01",  # only the backfill's runs
    }
    cluster: CeleryCluster = airflow_cluster_factory(
        dags_folder=dags,
        env=env,
        pools={"onceflow_warehouse": 4},
        executor="celery",
        celery={"worker_concurrency": 3},
    )
    cluster.wait_for_dag("daily_sales")
    backfill = create_backfill(cluster, "daily_sales", days[0], days[-1], timezone=TZ, max_active_runs=8)
    # mid-way: some days done, and worker-1 busy with one
    wait_until(lambda: succeeded_runs(cluster, backfill) >= 5, 900, "5 days loaded", cluster)

    # The session's metadata DB may hold daily_sales from an earlier test's cluster (the repo's
    # DAG folder, its real start date): its scheduled run is not this backfill's.
    def ours() -> set[str]:
        return {r["run_id"] for r in backfill_runs(cluster, backfill)}

    killed = kill_mid_flight(cluster, "daily_sales", runs=ours)
    runs = wait_for_backfill(cluster, backfill, timeout=2400, poll=5.0)
    # nothing left queued or running once the backfill is complete (bounded wait)
    wait_until(
        lambda: not [ti for ti in non_terminal(cluster, "daily_sales") if ti["run_id"] in ours()],
        300,
        "every task terminal",
        cluster,
    )

    assert [r["state"] for r in runs] == ["success"] * 30, cluster.task_log_tails("daily_sales")
    tis = [ti for ti in cluster.task_instances("daily_sales") if ti["run_id"] in ours()]
    assert len(tis) == 90 and {ti["state"] for ti in tis} == {"success"}
    retried = {(ti["run_id"], ti["task_id"]) for ti in tis if ti["try_number"] > 1}
    assert {(t["run_id"], t["task_id"]) for t in killed["tasks"]} <= retried, (killed, retried)
    loaded = stored_partitions(warehouse, days)
    assert loaded == expected
    assert {k: (p.row_count, p.net_cents) for k, p in loaded.items()} == {
        k: (t.row_count, t.net_cents) for k, t in by_sql.items()
    }
    # every day was handed over through onceflow_storage: a complete folder per day in the
    # storage (a killed try's run keeps its one folder), and nothing on a worker's own disk
    staged = shared.names("sales-staging/daily_sales")
    manifests = {name.split("/")[0] for name in staged if name.endswith("/manifest.json")}
    assert manifests == {d.isoformat() for d in days}, staged
    assert local_staging(cluster) == []


# -- the sheet queue and the article chain ---------------------------------------------------------

QUEUE_HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]


def rows_processed(
    n_rows: int,
    shared: SharedStorage,
    airflow_cluster_factory: Callable[..., Any],
    sheets_emulator: SheetsEmulator,
    article_site: ArticleSite,
    postgres_url_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    urls = [article_site.url(f"/articles/gazpacho.html?n={i}") for i in range(n_rows)]
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [QUEUE_HEADER, *([u, "NEW"] for u in urls)]}
    )
    ledger_url = postgres_url_factory("cledger")
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("sheet_claim.py", "article_pipeline.py", "sheet_reconcile.py"):
        shutil.copy(REPO_DAGS / name, dags / name)
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": sheets_emulator.connection_json(spreadsheet_id=sid),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": pg_connection(ledger_url),
        "AIRFLOW_CONN_ONCEFLOW_FETCH": json.dumps(
            {"conn_type": "generic", "extra": {"allow": [article_site.address]}}
        ),
        # step outputs under <root>/articles, pages under <root>/published
        "AIRFLOW_CONN_ONCEFLOW_STORAGE": shared.connection(
            publish_base=f"{shared.root}/published", public_url=article_site.url("/published")
        ),
        # every demo page scores above this: all publish, none waits for a reviewer
        "AIRFLOW_VAR_ONCEFLOW_SCORE_THRESHOLD": "0.05",
    }
    began = dt.datetime.now(dt.timezone.utc)
    cluster: CeleryCluster = airflow_cluster_factory(
        dags_folder=dags,
        env=env,
        pools={"onceflow_sheets": 16, "onceflow_fetch": 4, "onceflow_translate": 2},
        parallelism=16,
        executor="celery",
        celery={"worker_concurrency": 4},
    )

    # The session's metadata DB keeps the runs of earlier tests (the other storage's variant ran
    # the same DAG; all of them ended before this cluster started): everything below looks at this
    # test's article runs only, those not started yet or started after this cluster came up.
    def our_runs() -> list[dict[str, Any]]:
        return [
            r
            for r in cluster.dag_runs("article_pipeline")
            if r["start_date"] is None or r["start_date"] >= began
        ]

    def ours() -> set[str]:
        return {r["run_id"] for r in our_runs()}

    claim = cluster.trigger("sheet_claim", conf={"max_rows": n_rows})
    # every row has its run before the kill: the kill hits the chain, not the claim
    wait_until(lambda: len(our_runs()) >= n_rows, 900, "one run per row", cluster)
    killed = kill_mid_flight(cluster, "article_pipeline", runs=ours)

    def all_runs_finished() -> bool:
        runs = our_runs()
        return len(runs) == n_rows and all(r["state"] in {"success", "failed"} for r in runs)

    wait_until(all_runs_finished, 60 * max(15, n_rows // 4), "every article run finished", cluster)
    wait_until(
        lambda: not [ti for ti in non_terminal(cluster, "article_pipeline") if ti["run_id"] in ours()],
        300,
        "every task terminal",
        cluster,
    )
    # the triggered claim ends too (its sensor skips once the scheduled run took every row first)
    assert cluster.wait_for_run("sheet_claim", claim, timeout=600) == "success"
    runs = our_runs()
    assert {r["state"] for r in runs} == {"success"}, cluster.task_log_tails("article_pipeline")
    mine = ours()
    tis = [ti for ti in cluster.task_instances("article_pipeline") if ti["run_id"] in mine]
    retried = {(ti["run_id"], ti["task_id"]) for ti in tis if ti["try_number"] > 1}
    assert {(t["run_id"], t["task_id"]) for t in killed["tasks"]} <= retried, (killed, retried)

    # The sheet: every row claimed exactly once, each with its own token, each token on one run.
    rows = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows
    tokens = {r.get("url"): r.token for r in rows}
    assert sorted(tokens) == sorted(urls) and all(tokens.values())
    assert len(set(tokens.values())) == n_rows
    confs = [
        r["conf"] if isinstance(r["conf"], dict) else json.loads(r["conf"])
        for r in cluster.query("SELECT run_id, conf FROM dag_run WHERE dag_id = 'article_pipeline'")
        if r["run_id"] in mine
    ]
    assert sorted(c["claim_token"] for c in confs) == sorted(str(t) for t in tokens.values())
    # ... and each ended DONE (a second claim of one row would have marked one DUPLICATE)
    assert {r.get("status").split(" ")[0] for r in rows} == {"DONE"}, rows
    # The ledger, by plain SQL: each article's steps committed once, the first naming its own run.
    engine = create_engine(ledger_url)
    try:
        with engine.connect() as conn:
            results = conn.execute(text("SELECT work_key, step, payload FROM results")).all()
    finally:
        engine.dispose()
    steps = {ti["task_id"] for ti in tis}
    committed = {step for _, step, _ in results}
    assert "read_claimed_row" in committed and committed <= steps, committed
    assert len(results) == n_rows * len(committed)
    run_ids = sorted(
        json.loads(payload)["run_id"] for _, step, payload in results if step == "read_claimed_row"
    )
    assert run_ids == sorted(r["run_id"] for r in runs)
    # No article published twice: one object per article under the publish prefix (no second
    # copy, no temporary left behind by a killed writer), each row linking its own.
    pages = shared.names("published")
    assert len(pages) == n_rows, pages
    links = {r.get("published_url") for r in rows}
    assert len(links) == n_rows and all(link.startswith(article_site.url("/published/")) for link in links)
    assert {link.rsplit("/published/", 1)[1] for link in links} == set(pages)


@pytest.mark.slow  # 13 min on a loaded 2-core box (make test-slow)
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("storage", STORAGES)
def test_claimed_rows_are_processed_once_despite_kills(
    storage: str,
    request: pytest.FixtureRequest,
    airflow_cluster_factory: Callable[..., Any],
    sheets_emulator: SheetsEmulator,
    article_site: ArticleSite,
    postgres_url_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    shared = shared_storage(storage, request, tmp_path)
    rows_processed(
        20, shared, airflow_cluster_factory, sheets_emulator, article_site, postgres_url_factory, tmp_path
    )


@pytest.mark.slow
@pytest.mark.timeout(3 * 3600)
@pytest.mark.parametrize("storage", STORAGES)
def test_200_claimed_rows_are_processed_once_despite_kills(
    storage: str,
    request: pytest.FixtureRequest,
    airflow_cluster_factory: Callable[..., Any],
    sheets_emulator: SheetsEmulator,
    article_site: ArticleSite,
    postgres_url_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    shared = shared_storage(storage, request, tmp_path)
    rows_processed(
        200, shared, airflow_cluster_factory, sheets_emulator, article_site, postgres_url_factory, tmp_path
    )
