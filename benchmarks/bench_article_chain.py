"""Article chain end to end through the real scheduler: against a same-shape empty chain, mapped, and the batch lane.

Real Airflow (api-server, scheduler with the LocalExecutor, dag-processor, triggerer) on a
PostgreSQL metadata DB, the Sheets emulator and the demo article site in this process on
127.0.0.1, the ledger on PostgreSQL, step outputs and published pages on local files, real
Apertium. Each measurement fills the queue tab with ``--articles`` NEW rows (good Spanish demo
pages, ``?n=<i>`` so every row is its own article; all score above the 0.7 threshold, so no run
waits for a reviewer: rows that end otherwise are counted apart) and times, from the trigger to
the last row DONE (read from the emulator's cells every second), side by side (``sidebyside.py``:
one untimed warm-up pass of each side, then ``--repeat`` passes with the order of the sides
alternated, every pass printed with the load average):

* ``empty-chain``: the floor. ``empty_claim`` (a ``wait_for_new_rows`` and a ``claim_rows`` task in
  pool ``onceflow_sheets``, the second creating N runs as ``sheet_claim`` does, through the same
  ``create_dag_run``) and ``empty_pipeline``, generated from the real ``article_pipeline`` (read
  in a subprocess at start): the same 12 task ids, pools, trigger rules, retries, dependencies and
  ``max_active_runs``, each task a ``@task`` that does nothing (a task process each, as the real
  ones), the two score branches ``@task.branch`` returning the branch's "above" task. It touches no
  sheet, ledger or page: its wall time is what Airflow costs for the same shape;
* ``per-article``: the real ``sheet_claim`` (a copy with ``schedule=None``, so only the trigger
  claims; ``max_rows`` = N through the run's conf) creating one real ``article_pipeline`` run per
  row;
* ``mapped``: a benchmark DAG whose first task claims N rows once and registers them in the ledger
  (``register_claims``, as ``sheet_claim`` does), then the SAME step operators mapped over the
  claims (``.partial(...).expand(claim=...)``): read_claimed_row, fetch, extract, translate,
  score, publish, write_back, in the pools ``article_pipeline`` uses. No score branch: every page
  scores above the threshold (checked on the rows afterwards). One task instance per article and
  step, as in the per-article chain, in one run;
* ``batch-lane``: the real ``sheet_claim`` with ``batch_size`` = ``--batch-size`` (10) through the
  run's conf, creating one real ``article_batch`` run per batch (``dags/article_batch.py``): one
  task instance per step for the whole batch, each article still its own fenced ledger step.
  Its articles/min is printed against the per-article chain's.

The compared figure is ``runs wall``: from the trigger to the end of the last run of the pass
(``dag_run.end_date`` in the metadata DB), the same clock for every side; the ratio of each side's
median to the empty chain's is printed.

Scheduling overhead, from the metadata DB (``task_instance.duration``, from the task's start to
its end as Airflow records them, so a task process's start-up and DAG parse count as work):

* per run: ``(run end - run start - sum of its TI durations) / (run end - run start)``; for the
  per-article side the median over the article runs; for the batch run it goes negative when
  mapped tasks overlap (it is printed, but read the next figure);
* overall: ``1 - sum of the durations of every TI of the measurement / (wall x parallelism)``,
  wall being trigger to last row DONE: the share of the executor's slots not running a task.

Sheets requests, from the emulator's request log (reset before each trigger): the claim share is
every request that arrived before the first chain task started (the sensor's check, the claim's
read, a ``spreadsheets.get`` bringing the tab id with the values, and its write; the claim makes
all its sheet calls before it creates any run), divided by N; the rest, divided by the rows DONE,
is the chain's per-article cost (``read_claimed_row``'s ``write_fields`` and the write-back relay
passes of ``write_back``, each with its ``spreadsheets.get`` for the tab id), split into reads,
writes and ``spreadsheets.get``. Printed with them: the articles/min ceiling those requests allow
under Google's 60 reads + 60 writes per minute per user.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onceflow.preload import write_local_settings
from onceflow.sheets.model import Snapshot
from onceflow.testing import postgres
from onceflow.testing.article_site import serve
from onceflow.testing.sales_backfill import standalone_cluster
from onceflow.testing.sheets_emulator.server import METHODS
from onceflow.testing.sheets_fixtures import SheetsEmulator
from sidebyside import Result, load_average, measure_sides, print_table

DAGS = Path(__file__).resolve().parents[1] / "dags"
HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
#: Plain Spanish demo pages; each scores 0.9 to 1.0 with Apertium, above the 0.7 threshold.
PAGES = [
    "huertos-urbanos",
    "tren-nocturno",
    "biblioteca-movil",
    "gazpacho",
    "cooperativa-solar",
    "historia-del-cafe",
]
POOLS = {"onceflow_sheets": 10, "onceflow_fetch": 4, "onceflow_translate": 2}
CHAIN, MAPPED, CLAIM, LANE = "article_pipeline", "article_mapped", "sheet_claim", "article_batch"
EMPTY_CLAIM, EMPTY_CHAIN = "empty_claim", "empty_pipeline"
MODES = ("empty-chain", "per-article", "mapped", "batch-lane")
THRESHOLD = 0.7  # the default of onceflow_score_threshold; the mapped DAG has no branch
FINAL = {"DONE", "FAILED", "REJECTED", "NEEDS_REVIEW", "INVALID", "DUPLICATE"}

MAPPED_DAG = """
from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from onceflow.operators.articles import (
    ExtractArticleOperator,
    FetchArticleOperator,
    PublishArticleOperator,
    ScoreArticleOperator,
    TranslateArticleOperator,
    WriteBackOperator,
)
from onceflow.operators.sheets import ClaimedRowOperator


@dag(
    dag_id="article_mapped",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={"max_rows": 50, "processing_version": "v1"},
    default_args={"owner": "onceflow", "retries": 3, "retry_delay": timedelta(seconds=30)},
    tags=["benchmark"],
)
def article_mapped():
    @task(pool="onceflow_sheets")
    def claim_batch(params=None):
        # what SheetClaimOperator does, minus creating runs: claim in the sheet, then the ledger
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.hooks.sheets import SheetQueueHook
        from onceflow.sheets.ledger_link import ClaimRecord, register_claims

        version = str(params["processing_version"])
        hook = SheetQueueHook("onceflow_sheets")
        claims = hook.queue(version).claim(int(params["max_rows"])).claims
        confs = [c.conf(hook.spreadsheet_id, hook.sheet, version) for c in claims]
        records = [ClaimRecord(c.row_key, c.row_number, c.token, f) for c, f in zip(claims, confs)]
        register_claims(LedgerHook("onceflow_ledger").get_ledger(), records)
        return confs

    claims = claim_batch()
    steps = [
        (ClaimedRowOperator, "read_claimed_row", "onceflow_sheets"),
        (FetchArticleOperator, "fetch", "onceflow_fetch"),
        (ExtractArticleOperator, "extract", "default_pool"),
        (TranslateArticleOperator, "translate", "onceflow_translate"),
        (ScoreArticleOperator, "score", "default_pool"),
        (PublishArticleOperator, "publish", "default_pool"),
        (WriteBackOperator, "write_back", "onceflow_sheets"),
    ]
    upstream = claims
    for operator, task_id, pool in steps:
        # the pool given here: a mapped operator is scheduled before its __init__ sets a default
        mapped = operator.partial(task_id=task_id, pool=pool).expand(claim=claims)
        upstream >> mapped
        upstream = mapped


article_mapped()
"""


#: Prints article_pipeline's shape as JSON; run in a subprocess so this process never imports Airflow.
SHAPE_PROBE = """
import gc, json, runpy, sys
from airflow.sdk import DAG
runpy.run_path(sys.argv[1])
[dag] = [o for o in gc.get_objects() if isinstance(o, DAG) and o.dag_id == "article_pipeline"]
print(json.dumps({"max_active_runs": dag.max_active_runs, "tasks": [
    {"task_id": t.task_id, "pool": t.pool, "trigger_rule": str(t.trigger_rule.value), "retries": t.retries,
     "upstream": sorted(t.upstream_task_ids), "above": getattr(t, "above", None)}
    for t in dag.topological_sort()]}))
"""

EMPTY_CLAIM_DAG = """
import pendulum
from airflow.sdk import dag, task

from onceflow.operators.sheets import create_dag_run


@dag(dag_id="empty_claim", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
     catchup=False, max_active_runs=1, params={"max_rows": 50, "batch": "0"}, tags=["benchmark"])
def empty_claim():
    @task(pool="onceflow_sheets")
    def wait_for_new_rows():
        pass

    @task(pool="onceflow_sheets")
    def claim_rows(params=None):
        # one run per "row", created the way SheetClaimOperator creates them
        for i in range(int(params["max_rows"])):
            create_dag_run("empty_pipeline", f"empty__{params['batch']}__{i}", {"row": i})

    wait_for_new_rows() >> claim_rows()


empty_claim()
"""


def empty_chain_dag(shape: dict[str, Any]) -> str:
    """``empty_pipeline``: article_pipeline's tasks, pools, trigger rules and edges, doing nothing."""
    lines = [
        "import pendulum",
        "from airflow.sdk import dag, task",
        "",
        "",
        f"@dag(dag_id={EMPTY_CHAIN!r}, schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz='UTC'),",
        f"     catchup=False, max_active_runs={shape['max_active_runs']}, tags=['benchmark'])",
        "def empty_pipeline():",
        "    t = {}",
    ]
    for t in shape["tasks"]:
        kind = "task.branch" if t["above"] else "task"
        body = f"return {t['above']!r}" if t["above"] else "pass"
        lines += [
            f"    @{kind}(task_id={t['task_id']!r}, pool={t['pool']!r}, trigger_rule={t['trigger_rule']!r},"
            f" retries={t['retries']})",
            "    def step():",
            f"        {body}",
            "",
            f"    t[{t['task_id']!r}] = step()",
        ]
    for t in shape["tasks"]:
        lines += [f"    t[{u!r}] >> t[{t['task_id']!r}]" for u in t["upstream"]]
    lines += ["", "", "empty_pipeline()", ""]
    return "\n".join(lines)


def article_pipeline_shape(home: Path) -> dict[str, Any]:
    """The real article_pipeline's shape, read by Airflow in a subprocess."""
    import subprocess

    env = {**os.environ, "AIRFLOW_HOME": str(home)}
    out = subprocess.run(
        [sys.executable, "-c", SHAPE_PROBE, str(DAGS / "article_pipeline.py")],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    shape: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return shape


def fill_queue(emulator: SheetsEmulator, sid: str, urls: list[str]) -> None:
    """The queue tab anew with ``urls`` as NEW rows, same spreadsheet id (no request counted)."""
    server = emulator.server
    with server.store.lock:
        server.store.spreadsheets.pop(sid, None)
    emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]]},
                                spreadsheet_id=sid)  # fmt: skip


def statuses(emulator: SheetsEmulator, sid: str) -> dict[str, str]:
    """URL -> status word, straight from the emulator's cells."""
    rows = Snapshot.from_values(emulator.values(sid, "queue")).rows
    return {r.url: r.status.value if r.status is not None else "?" for r in rows}


def seconds(td: Any) -> float:
    return float(td.total_seconds()) if td is not None else 0.0


def run_figures(
    cluster: Any, runs: list[tuple[str, str]], per_run_dags: set[str], t0_wall: dt.datetime, wall: float,
    parallelism: int,
) -> tuple[dict[str, float], list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """The scheduling figures of a pass's ``(dag_id, run_id)`` runs, from the metadata DB (module doc).

    ``per_run_dags``: the DAGs whose runs count in the per-run overhead (not the claim's). Also
    returns the runs' rows (state, start, end) and their task instances' (task id, start), each
    with its ``dag_id``, for what a side reads beyond the figures.
    """
    per_run: list[float] = []
    busy = 0.0
    last_end = t0_wall
    run_rows: list[dict[str, Any]] = []
    ti_rows: list[dict[str, Any]] = []
    for d, r in runs:
        [run] = cluster.query(
            "SELECT state, start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r", d=d, r=r
        )
        tis = cluster.query(
            "SELECT task_id, start_date, COALESCE(duration, 0) AS duration FROM task_instance "
            "WHERE dag_id = :d AND run_id = :r",
            d=d, r=r,
        )  # fmt: skip
        work = sum(float(t["duration"]) for t in tis)
        busy += work
        last_end = max(last_end, run["end_date"])
        run_wall = seconds(run["end_date"] - run["start_date"])
        if d in per_run_dags and run_wall > 0:
            per_run.append((run_wall - work) / run_wall)
        run_rows.append({"dag_id": d, **run})
        ti_rows += [{"dag_id": d, **t} for t in tis]
    figures = {
        "runs_wall": seconds(last_end - t0_wall),
        "per_run_overhead": statistics.median(per_run) if per_run else float("nan"),
        "overall_overhead": 1.0 - busy / (wall * parallelism),
        "busy": busy,
    }
    return figures, run_rows, ti_rows


def measure(
    cluster: Any, emulator: SheetsEmulator, sid: str, mode: str, urls: list[str], parallelism: int,
    timeout: float, batch_size: int = 10,
) -> dict[str, Any]:  # fmt: skip
    """One timed pass of ``mode`` over ``urls``; the figures of the module docstring."""
    if mode == "empty-chain":
        return measure_empty(cluster, urls, parallelism, timeout)
    fill_queue(emulator, sid, urls)
    log = emulator.request_log
    log.reset()
    offset = time.time() - time.monotonic()  # the log's arrival times are this process's monotonic
    load_before = load_average()
    t0_wall = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    dag_id = MAPPED if mode == "mapped" else CLAIM
    conf: dict[str, Any] = {"max_rows": len(urls), "processing_version": "v1"}
    if mode == "batch-lane":
        conf["batch_size"] = batch_size
    run_id = cluster.trigger(dag_id, conf=conf)
    trigger_s = time.monotonic() - started  # the `airflow dags trigger` CLI, inside the wall time
    deadline = started + timeout
    while True:
        seen = statuses(emulator, sid)
        if all(seen.get(u, "NEW").split(" ")[0] in FINAL for u in urls):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{mode}: rows not final after {timeout}s: {seen}\n{cluster.log_tails()}")
        time.sleep(1.0)
    wall = time.monotonic() - started
    load_after = load_average()
    final = {u: seen[u].split(" ")[0] for u in urls}
    rows = {r.url: r for r in Snapshot.from_values(emulator.values(sid, "queue")).rows}
    below = sum(1 for u in urls if final[u] == "DONE" and float(rows[u].get("score") or 0) < THRESHOLD)
    done = sum(1 for s in final.values() if s == "DONE")
    events = log.timeline
    counts = log.counts

    # the runs of this pass must end before the metadata DB says all about them
    dag_runs = [(dag_id, run_id)]
    cluster.wait_for_run(dag_id, run_id, timeout=600)
    if mode in ("per-article", "batch-lane"):
        chain = CHAIN if mode == "per-article" else LANE
        chain_runs = cluster.query(
            "SELECT run_id FROM dag_run WHERE dag_id = :d AND queued_at >= :t", d=chain, t=t0_wall
        )
        for r in chain_runs:
            cluster.wait_for_run(chain, r["run_id"], timeout=600)
        dag_runs += [(chain, r["run_id"]) for r in chain_runs]
    figures, _, tis = run_figures(
        cluster, dag_runs, {d for d, _ in dag_runs if d != CLAIM}, t0_wall, wall, parallelism
    )
    # the claim's sheet calls all come before the first chain task starts (module doc)
    first_chain_start = min(
        (
            t["start_date"]
            for t in tis
            if t["dag_id"] != CLAIM and t["task_id"] != "claim_batch" and t["start_date"] is not None
        ),
        default=None,
    )
    boundary = first_chain_start.timestamp() if first_chain_start else float("inf")
    claim_events = [e for e in events if e.at + offset < boundary]
    chain_events = [e for e in events if e.at + offset >= boundary]

    def split(evs: list[Any]) -> dict[str, int]:
        writes = sum(1 for e in evs if METHODS[e.method][1])
        gets = sum(1 for e in evs if e.method == "spreadsheets.get")
        return {"reads": len(evs) - writes, "writes": writes, "gets": gets, "total": len(evs)}

    claim, chain = split(claim_events), split(chain_events)
    return {
        "mode": mode,
        "n": len(urls),
        "done": done,
        "other": {s: sum(1 for v in final.values() if v == s) for s in set(final.values()) if s != "DONE"},
        "wall": wall,
        "trigger_s": trigger_s,
        "below_threshold": below,
        "per_min": 60.0 * done / wall,
        **figures,
        "claim_per_article": {k: v / len(urls) for k, v in claim.items()},
        "chain_per_article": {k: v / max(done, 1) for k, v in chain.items()},
        "methods": counts,
        "timeline_complete": len(events) == log.total,
        "load": (load_before, load_after),
        # where a batch run's time goes: each task's duration (task process start-up included)
        "task_seconds": {
            t["task_id"]: round(float(t["duration"]), 1)
            for t in tis
            if t["dag_id"] == LANE and t["start_date"] is not None
        },
    }


def measure_empty(cluster: Any, urls: list[str], parallelism: int, timeout: float) -> dict[str, Any]:
    """One pass of the empty chain: N runs of ``empty_pipeline`` from one ``empty_claim`` run."""
    load_before = load_average()
    t0_wall = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    batch = f"{int(time.time() * 1000)}"
    run_id = cluster.trigger(EMPTY_CLAIM, conf={"max_rows": len(urls), "batch": batch})
    trigger_s = time.monotonic() - started
    cluster.wait_for_run(EMPTY_CLAIM, run_id, timeout=timeout)
    runs = [f"empty__{batch}__{i}" for i in range(len(urls))]
    for r in runs:
        cluster.wait_for_run(EMPTY_CHAIN, r, timeout=max(60.0, timeout - (time.monotonic() - started)))
    wall = time.monotonic() - started
    figures, run_rows, _ = run_figures(
        cluster, [(EMPTY_CLAIM, run_id), *[(EMPTY_CHAIN, r) for r in runs]], {EMPTY_CHAIN}, t0_wall, wall,
        parallelism,
    )  # fmt: skip
    states = Counter(run["state"] for run in run_rows)
    done = states.get("success", 0) - 1  # the claim run's own success
    zero = {"reads": 0.0, "writes": 0.0, "gets": 0.0, "total": 0.0}
    return {
        "mode": "empty-chain",
        "n": len(urls),
        "done": done,
        "other": {s: c for s, c in states.items() if s != "success"},
        "wall": wall,
        "trigger_s": trigger_s,
        "below_threshold": 0,
        "per_min": 60.0 * done / wall,
        **figures,
        "claim_per_article": zero,
        "chain_per_article": zero,
        "methods": {},
        "timeline_complete": True,
        "load": (load_before, load_average()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--articles", type=int, default=50, help="rows per measurement (default 50)")
    parser.add_argument(
        "--repeat", type=int, default=None, help="timed passes of each side (default 3; --quick 1)"
    )
    parser.add_argument("--quick", action="store_true", help="10 articles, 1 timed pass after the warm-up")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"sides to run, the first is the ratios' baseline ({','.join(MODES)})",
    )
    parser.add_argument("--workers", type=int, default=4, help="LocalExecutor parallelism (default 4)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=10,
        help="sheet_claim's batch_size for the batch-lane side (default 10)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per measurement")
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="do not preload the task libraries and the language detector in the scheduler "
        "(onceflow.preload, airflow_local_settings.py)",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: cluster stopped, DBs dropped
    n = 10 if args.quick else args.articles
    repeat = args.repeat or (1 if args.quick else 3)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")

    ledger = postgres.create_database("bchainledger")
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-chain-"))
    emulator = SheetsEmulator(state=None)
    samples: list[Any] = []
    try:
        with serve(published_dir=work / "published") as site:
            (work / "published").mkdir(exist_ok=True)
            sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER]})
            dags = work / "dags"
            dags.mkdir()
            # only the trigger claims: a scheduled sheet_claim would take the rows first
            claim_source = (DAGS / "sheet_claim.py").read_text()
            assert 'schedule="*/5 * * * *"' in claim_source
            (dags / "sheet_claim.py").write_text(
                claim_source.replace('schedule="*/5 * * * *"', "schedule=None")
            )
            shutil.copy(DAGS / "article_pipeline.py", dags / "article_pipeline.py")
            shutil.copy(DAGS / "article_batch.py", dags / "article_batch.py")
            (dags / "article_mapped.py").write_text(textwrap.dedent(MAPPED_DAG))
            (dags / "empty_claim.py").write_text(textwrap.dedent(EMPTY_CLAIM_DAG))
            (work / "probe").mkdir()
            (dags / "empty_pipeline.py").write_text(empty_chain_dag(article_pipeline_shape(work / "probe")))
            env = {
                "AIRFLOW_CONN_ONCEFLOW_SHEETS": emulator.connection_json(spreadsheet_id=sid),
                # the preload builds the Sheets resources for the emulator too (onceflow.sheets.service)
                "ONCEFLOW_SHEETS_API_ENDPOINTS": emulator.endpoint,
                "AIRFLOW_CONN_ONCEFLOW_LEDGER": json.dumps(
                    {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger}}
                ),
                "AIRFLOW_CONN_ONCEFLOW_FETCH": json.dumps(
                    {"conn_type": "generic", "extra": {"allow": [site.address]}}
                ),
                "AIRFLOW_CONN_ONCEFLOW_STORAGE": json.dumps(
                    {
                        "conn_type": "google_cloud_platform",
                        "extra": {
                            "base": (work / "steps").as_uri(),
                            "publish_base": (work / "published").as_uri(),
                            "public_url": site.url("/published"),
                        },
                    }
                ),
            }
            if not args.no_preload:
                # The deployment setting docs/deploy.md recommends for forking executors: the
                # Google clients and the language detector once in the scheduler, not per task.
                write_local_settings(work / "home")
            print(f"task libraries preloaded in the scheduler: {not args.no_preload}", flush=True)
            with standalone_cluster(work, dags, env=env, pools=POOLS, parallelism=args.workers) as cluster:
                for dag_id in (CLAIM, CHAIN, MAPPED, LANE, EMPTY_CLAIM, EMPTY_CHAIN):
                    cluster.wait_for_dag(dag_id)

                def side(mode: str) -> Any:
                    def run(rep: int) -> Result:
                        urls = [
                            site.url(f"/articles/{PAGES[i % len(PAGES)]}.html?n={mode}-{rep}-{i}")
                            for i in range(n)
                        ]
                        r = measure(
                            cluster, emulator, sid, mode, urls, args.workers, args.timeout, args.batch_size
                        )
                        if r.get("task_seconds"):
                            print(f"    batch run task seconds: {r['task_seconds']}", flush=True)
                        print(
                            f"    {r['done']} done in {r['wall']:.1f} s ({r['per_min']:.1f}/min), runs ended "
                            f"after {r['runs_wall']:.1f} s, other {r['other']}, DONE below the threshold "
                            f"{r['below_threshold']}, trigger CLI {r['trigger_s']:.1f} s",
                            flush=True,
                        )
                        return Result(r["runs_wall"], r)

                    return run

                samples = measure_sides({m: side(m) for m in modes}, repeat)
    finally:
        emulator.stop()
        shutil.rmtree(work, ignore_errors=True)
        postgres.drop_database(ledger)

    print(
        f"article chain end to end, {n} articles x {repeat} passes per side; LocalExecutor parallelism "
        f"{args.workers}, pools {POOLS}, {os.cpu_count()} CPUs; PostgreSQL metadata DB and ledger; Apertium"
    )
    results = [s.detail | {"rep": s.rep} for s in samples if s.rep > 0]
    print(
        f"{'rep':>3}  {'mode':<12}{'DONE':>5}{'wall s':>8}{'art/min':>9}{'ovh/run':>9}{'ovh all':>9}"
        f"{'claim req/art':>14}{'chain r/w/get per art':>23}  load 1/5/15 before -> after"
    )
    for r in results:
        c, p = r["claim_per_article"], r["chain_per_article"]
        print(
            f"{r['rep']:>3}  {r['mode']:<12}{r['done']:>5}{r['wall']:8.1f}{r['per_min']:9.1f}"
            f"{r['per_run_overhead']:9.0%}{r['overall_overhead']:9.0%}{c['total']:14.2f}"
            f"{p['reads']:>9.2f}/{p['writes']:.2f}/{p['gets']:.2f}       {r['load'][0]} -> {r['load'][1]}"
        )
    print("medians:")
    medians: dict[str, dict[str, float]] = {}
    for mode in modes:
        mine = [r for r in results if r["mode"] == mode]
        m = {
            key: statistics.median(r[key] for r in mine)
            for key in ("wall", "per_min", "per_run_overhead", "overall_overhead")
        }
        for part in ("claim_per_article", "chain_per_article"):
            for k in ("reads", "writes", "gets", "total"):
                m[f"{part}.{k}"] = statistics.median(r[part][k] for r in mine)
        medians[mode] = m
        print(
            f"  {mode:<12} {m['per_min']:.1f} articles/min (wall {m['wall']:.1f} s); overhead per run "
            f"{m['per_run_overhead']:.0%}, of all slots {m['overall_overhead']:.0%}; Sheets requests per "
            f"article: claim share {m['claim_per_article.total']:.2f} ({m['claim_per_article.reads']:.2f} "
            f"reads incl. {m['claim_per_article.gets']:.2f} spreadsheets.get, "
            f"{m['claim_per_article.writes']:.2f} writes) + chain {m['chain_per_article.reads']:.2f} reads "
            f"(incl. {m['chain_per_article.gets']:.2f} spreadsheets.get) / "
            f"{m['chain_per_article.writes']:.2f} writes"
        )
    print_table(samples, baseline=modes[0], unit="s from the trigger to the last run's end")
    for mode in ("mapped", "batch-lane"):
        if mode in medians and "per-article" in medians:
            ratio = medians[mode]["per_min"] / medians["per-article"]["per_min"]
            size = f" (batch_size {args.batch_size})" if mode == "batch-lane" else ""
            print(
                f"{mode}{size} / per-article articles per minute: {medians[mode]['per_min']:.1f} / "
                f"{medians['per-article']['per_min']:.1f} = {ratio:.2f}x"
            )
    for mode in (m for m in modes if m != "empty-chain"):
        m = medians[mode]
        reads = m["claim_per_article.reads"] + m["chain_per_article.reads"]
        writes = m["claim_per_article.writes"] + m["chain_per_article.writes"]
        ceiling = 60.0 / max(reads, writes, 1e-9)
        print(
            f"quota ceiling, {mode}: {reads:.2f} reads + {writes:.2f} writes per article (claim share +"
            f" chain, the write-back relay included) allow {ceiling:.1f} articles/min under 60 + 60 per minute"
        )
    last = {r["mode"]: r["methods"] for r in results[-len(modes) :]}
    print(f"requests per method, last pass of each side: {json.dumps(last)}")
    ok = all(r["done"] == r["n"] and r["timeline_complete"] for r in results)
    if not all(r["timeline_complete"] for r in results):
        print("the emulator's timeline lost requests: the claim/chain split is incomplete")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
