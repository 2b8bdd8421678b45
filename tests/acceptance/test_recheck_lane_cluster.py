"""Rechecks run in their own lane and do not delay new work (real scheduler, LocalExecutor).

The real ``recheck`` and ``article_pipeline`` DAG files (the chain's DAG id renamed so this test's
runs cannot meet another test's in the session's metadata DB) run against the Sheets emulator and
a ledger on SQLite. ``recheck`` re-opens N finished articles and dispatches them; its relay
creates N runs of the chain's recheck lane, every task in pool ``onceflow_recheck`` (one slot),
at a lower priority weight, under the lane DAG's own ``max_active_runs``. While they queue, a new
article arrives. Everything is measured from the task start times Airflow recorded:

* *delay* of an article: its task's ``start_date`` minus its run's ``queued_at``;
* *one task slot's time*: the median gap between consecutive starts of the recheck lane's tasks
  (one slot: each gap is one task holding it plus the hand-over to the next).

The new article's delay may exceed that of an article that arrived with nothing else queued by
at most one task slot's time. Before the lanes, recheck runs were runs of the new-work DAG itself:
the new article's run queued behind all of them (``max_active_runs``) and its task behind theirs
(pool ``onceflow_sheets``); the wait below gives up, and fails, once 5 recheck tasks started after
the new article arrived and it still had not.

One stand-in: the N articles' earlier processing is written straight into the ledger (the step's
own ``run_keyed_step``, no Airflow run), since only their recheck is under test.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import create_engine, text

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.ledger.steps import run_keyed_step
from onceflow.sheets import ledger_link
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = pytest.mark.real_airflow

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
#: New recheck tasks that may start after a new article arrived before the wait calls it starved.
STARVED_AFTER = 5


def lane_dags(folder: Path, chain: str) -> None:
    """The repo's recheck and article_pipeline DAG files, the chain's DAG id set to ``chain``."""
    folder.mkdir()
    shutil.copy(REPO_DAGS / "recheck.py", folder / "recheck.py")
    source = (REPO_DAGS / "article_pipeline.py").read_text()
    renamed = source.replace('CHAIN_DAG_ID = "article_pipeline"', f'CHAIN_DAG_ID = "{chain}"')
    assert renamed != source, "dags/article_pipeline.py no longer names its DAG id in CHAIN_DAG_ID"
    (folder / f"{chain}.py").write_text(renamed)


def claimed(cluster: Any, chain: str, run_id: str) -> None:
    """Wait until the run's ``read_claimed_row`` succeeded: the lane is about the claim step, not
    the article chain behind it (this test's URLs point nowhere)."""
    poll(
        lambda: any(
            t["task_id"] == "read_claimed_row" and t["state"] == "success"
            for t in cluster.task_instances(chain, run_id)
        ),
        240,
        f"read_claimed_row of {run_id}",
        cluster,
    )


def poll(predicate: Any, timeout: float, what: str, cluster: Any, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{cluster.log_tails()}")


def when(value: Any) -> dt.datetime | None:
    """A metadata DB time as an aware datetime (SQLite hands back text)."""
    if value is None:
        return None
    stamp = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)


def article_timing(cluster: Any, dag_id: str, run_id: str) -> dict[str, Any] | None:
    rows = cluster.query(
        "SELECT r.queued_at, t.start_date, t.state, t.pool, t.priority_weight FROM dag_run r "
        "JOIN task_instance t ON t.dag_id = r.dag_id AND t.run_id = r.run_id "
        "WHERE r.dag_id = :dag_id AND r.run_id = :run_id AND t.task_id = 'read_claimed_row'",
        dag_id=dag_id,
        run_id=run_id,
    )
    if not rows:
        return None
    return {**rows[0], "queued_at": when(rows[0]["queued_at"]), "start_date": when(rows[0]["start_date"])}


def recheck_starts(cluster: Any, dag_ids: tuple[str, ...], new_work: set[str]) -> list[Any]:
    """Start times of the recheck chain's tasks, in order (whichever DAG the runs went to)."""
    rows = cluster.query(
        "SELECT dag_id, run_id, start_date FROM task_instance WHERE dag_id IN ("
        + ", ".join(f"'{d}'" for d in dag_ids)
        + ") AND start_date IS NOT NULL ORDER BY start_date"
    )
    return [when(r["start_date"]) for r in rows if r["run_id"] not in new_work]


def seconds(later: Any, earlier: Any) -> float:
    return float((later - earlier).total_seconds())


def fail_leftover_runs(cluster: Any, dag_ids: tuple[str, ...]) -> None:
    """Stop the cluster and end this test's unfinished runs, so no later cluster runs them."""
    cluster.stop()
    engine = create_engine(cluster.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    ids = ", ".join(f"'{d}'" for d in dag_ids)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"UPDATE task_instance SET state = 'failed' WHERE dag_id IN ({ids}) "
                    "AND (state IS NULL OR state NOT IN ('success', 'failed', 'skipped', 'upstream_failed'))"
                )
            )
            conn.execute(
                text(
                    f"UPDATE dag_run SET state = 'failed' WHERE dag_id IN ({ids}) AND state IN ('queued', 'running')"
                )
            )
    finally:
        engine.dispose()


def run_lane_experiment(
    airflow_cluster_factory: Any, sheets_emulator: SheetsEmulator, tmp_path: Path, items: int
) -> None:
    tag = uuid.uuid4().hex[:8]
    chain = f"article_pipeline_lane_{tag}"
    recheck_lane_dag = f"{chain}_recheck"
    urls = [f"https://lanes.example/{tag}/{i}" for i in range(items + 2)]
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]]}
    )
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    claims = {c.url: c for c in queue.claim(items + 2).claims}
    assert len(claims) == items + 2
    old = [claims[u] for u in urls[:items]]
    baseline, newcomer = claims[urls[items]], claims[urls[items + 1]]

    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    records = [
        ledger_link.ClaimRecord(c.row_key, c.row_number, c.token, c.conf(sid, "queue", "v1"))
        for c in claims.values()
    ]
    ledger_link.register_claims(ledger, records)
    for claim in old:  # processed earlier (stand-in): the recheck re-opens them
        run_keyed_step(
            ledger,
            kind=ledger_link.KIND,
            work_key=ledger_link.work_key(claim.row_key),
            step=ledger_link.CLAIM_STEP,
            owner=f"{chain}/earlier/1",
            worker_version="v1",
            work=lambda _lease: {"processed": "earlier"},
        )

    dags = tmp_path / "dags"
    lane_dags(dags, chain)
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": sheets_emulator.connection_json(spreadsheet_id=sid),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": json.dumps(
            {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
        ),
    }
    # the recommended pool sizes (onceflow pools): one sheet writer, one recheck slot
    cluster = airflow_cluster_factory(
        dags_folder=dags, env=env, pools={"onceflow_sheets": 1, "onceflow_recheck": 1}
    )
    all_chain_dags = (chain, recheck_lane_dag)
    try:
        cluster.wait_for_dag(chain)
        # an article with nothing else queued
        base_run = cluster.trigger(chain, conf=baseline.conf(sid, "queue", "v1"), run_id=baseline.run_id)
        claimed(cluster, chain, base_run)
        base = article_timing(cluster, chain, base_run)
        assert base is not None
        base_delay = seconds(base["start_date"], base["queued_at"])

        recheck_run = cluster.trigger(
            "recheck",
            conf={
                "scope": "stale",
                "stale_after_days": 0,
                "reason": f"lane test {tag}",
                "kind": "article",
                "max_items": items,
                "chain_dag_id": recheck_lane_dag,
            },
        )
        assert cluster.wait_for_run("recheck", recheck_run, timeout=300) == "success", cluster.task_log_tails(
            "recheck"
        )
        new_work = {base_run, newcomer.run_id}
        poll(
            lambda: len(recheck_starts(cluster, all_chain_dags, new_work)) >= 2,
            240,
            "the recheck lane's first tasks to start",
            cluster,
        )

        new_run = cluster.trigger(chain, conf=newcomer.conf(sid, "queue", "v1"), run_id=newcomer.run_id)

        def started_or_starved() -> dict[str, Any] | None:
            seen = article_timing(cluster, chain, new_run)
            if seen is None or seen["queued_at"] is None:
                return None
            if seen["start_date"] is not None:
                return seen
            ahead = [s for s in recheck_starts(cluster, all_chain_dags, new_work) if s > seen["queued_at"]]
            return seen if len(ahead) >= STARVED_AFTER else None

        new = poll(started_or_starved, 600, "the new article's task to start", cluster)
        starts = recheck_starts(cluster, all_chain_dags, new_work)
        ahead = [
            s for s in starts if s > new["queued_at"] and (new["start_date"] is None or s < new["start_date"])
        ]
        assert new["start_date"] is not None, (
            f"the new article's task had not started after {len(ahead)} recheck tasks started ahead of it"
        )
        runs = cluster.dag_runs(recheck_lane_dag)
        assert len(runs) == items, "every re-opened article got one run in the recheck lane"
        lane_tis = cluster.task_instances(recheck_lane_dag)
        assert {t["pool"] for t in lane_tis} == {"onceflow_recheck"}
        assert {t["priority_weight"] for t in lane_tis} == {-100}
        assert new["pool"] == "onceflow_sheets" and new["priority_weight"] > -100

        poll(
            lambda: len(recheck_starts(cluster, all_chain_dags, new_work)) >= 4,
            240,
            "four recheck tasks",
            cluster,
        )
        starts = recheck_starts(cluster, all_chain_dags, new_work)
        slot = statistics.median(seconds(b, a) for a, b in itertools.pairwise(starts))
        delay = seconds(new["start_date"], new["queued_at"])
        print(
            f"\nrecheck items {items}: new article delay {delay:.2f}s, alone {base_delay:.2f}s, "
            f"one recheck slot {slot:.2f}s; recheck tasks started meanwhile: {len(ahead)}"
        )
        assert delay <= base_delay + slot, (
            f"{items} queued rechecks delayed a new article by {delay - base_delay:.2f}s, more than one "
            f"task slot's time ({slot:.2f}s): {delay:.2f}s against {base_delay:.2f}s alone"
        )
        claimed(cluster, chain, new_run)
        committed = [
            r.committed_by
            for r in ledger.results(ledger_link.work_key(newcomer.row_key))
            if r.step == ledger_link.CLAIM_STEP
        ]
        assert any(by.startswith(f"{chain}/{new_run}/") for by in committed), committed
    finally:
        engine.dispose()
        fail_leftover_runs(cluster, (*all_chain_dags, "recheck"))


def test_thirty_queued_rechecks_do_not_delay_a_new_article_by_more_than_one_slot(
    airflow_cluster_factory: Any, sheets_emulator: SheetsEmulator, tmp_path: Path
) -> None:
    run_lane_experiment(airflow_cluster_factory, sheets_emulator, tmp_path, items=30)


@pytest.mark.slow
def test_two_hundred_queued_rechecks_do_not_delay_a_new_article_by_more_than_one_slot(
    airflow_cluster_factory: Any, sheets_emulator: SheetsEmulator, tmp_path: Path
) -> None:
    run_lane_experiment(airflow_cluster_factory, sheets_emulator, tmp_path, items=200)
