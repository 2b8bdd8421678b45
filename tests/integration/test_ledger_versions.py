"""Processing versions gate rolling deployments (issue 11 defect 3).

Two real worker processes share one ledger, one deployed as ``v1`` and one as ``v2`` (their
Airflow setting ``[onceflow] worker_version``; the version is never taken from a run). The test
plays the scheduler: every item's run goes to one worker, and a run that worker leaves alone goes
to the other one next, as a deferred Airflow task resumes on whichever worker is free. Each
worker must take only the items its version may take, leave the others without failing them,
and every item must end done exactly once by the right version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.ledger.recheck import RecheckRequest, start_recheck
from onceflow.testing.dag_runner import FIRST_STEP_ONLY

if TYPE_CHECKING:
    from collections.abc import Iterator

WORKERS = {"old": "v1", "new": "v2"}
HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]


def start_worker(url: str, name: str, version: str) -> subprocess.Popen:
    env = {**os.environ, "AIRFLOW__ONCEFLOW__WORKER_VERSION": version}
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceflow.testing.version_worker", url, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    assert ready == {"ready": name, "version": version}, ready
    return proc


def hand_out(workers: dict[str, subprocess.Popen], batches: dict[str, list[str]]) -> list[tuple[str, dict]]:
    """Send each worker its batch at once (they work side by side), then read every answer."""
    for name, keys in batches.items():
        stdin = workers[name].stdin
        assert stdin is not None
        stdin.write("".join(f"{k}\n" for k in keys))
        stdin.flush()
    answers = []
    for name, keys in batches.items():
        stdout = workers[name].stdout
        assert stdout is not None
        for _ in keys:
            line = stdout.readline()
            assert line, f"worker {name} died (exit {workers[name].poll()})"
            answers.append((name, json.loads(line)))
    return answers


def test_old_and_new_workers_side_by_side_each_take_only_their_own_items(ledger_url):
    ledger = Ledger(create_ledger_engine(ledger_url))
    needs_v1 = [f"art:v1:{i}" for i in range(6)]
    needs_v2 = [f"art:v2:{i}" for i in range(6)]
    either = [f"art:any:{i}" for i in range(6)]
    for key in needs_v1:
        ledger.add("article", key, required_version="v1")
    for key in needs_v2:
        ledger.add("article", key, required_version="v2")
    for key in either:
        ledger.add("article", key)
    # finished by v1 earlier; a new_version recheck now wants them processed by v2
    redo = [f"art:redo:{i}" for i in range(4)]
    for key in redo:
        ledger.add("article", key)
        ledger.commit_result(
            ledger.lease_key("article", key, "before", 60, "v1", reopen_reason="-"), "process", {}
        )
    start_recheck(ledger, RecheckRequest("new_version", "model v2", "article", target_version="v2"))

    workers = {name: start_worker(ledger_url, name, version) for name, version in WORKERS.items()}
    try:
        last: dict[str, str] = {}
        todo = sorted(needs_v1 + needs_v2 + either + redo)
        answers = []
        for round_ in range(6):
            if not todo:
                break
            batches: dict[str, list[str]] = {"old": [], "new": []}
            for i, key in enumerate(todo):
                # first come: alternate; a run handed back goes to the other worker next
                name = ("old", "new")[i % 2] if key not in last else ("new" if last[key] == "old" else "old")
                batches[name].append(key)
                last[key] = name
            got = hand_out(workers, batches)
            answers += got
            errors = [a for _, a in got if a["outcome"] == "error"]
            assert errors == [], f"round {round_}: a worker failed an item instead of leaving it: {errors}"
            todo = sorted(a["key"] for _, a in got if a["outcome"] in ("deferred", "busy"))
        assert todo == [], f"still not done after 6 rounds: {todo}"
    finally:
        for proc in workers.values():
            assert proc.stdin is not None
            proc.stdin.close()
        exits = {name: proc.wait(timeout=60) for name, proc in workers.items()}
    assert exits == {"old": 0, "new": 0}

    deferred = {
        name: {a["key"] for n, a in answers if n == name and a["outcome"] == "deferred"} for name in WORKERS
    }
    assert deferred["old"] and deferred["old"] <= set(needs_v2 + redo), "old code left only v2 items"
    assert deferred["new"] and deferred["new"] <= set(needs_v1), "new code left only v1 items"
    assert all("requires processing version" in a["detail"] for _, a in answers if a["outcome"] == "deferred")

    def processed(key):
        return [
            (r.processing_version, r.payload.get("processed_by")) for r in ledger.results(key) if r.payload
        ]

    for key in needs_v1:
        assert processed(key) == [("v1", "old")]
    for key in needs_v2 + redo:
        assert processed(key) == [("v2", "new")]
    for key in either:
        assert processed(key) in ([("v1", "old")], [("v2", "new")])
    for key in needs_v1 + needs_v2 + either + redo:
        assert ledger.item(key).state == "done"
        events = [t.event for t in ledger.history(key)]
        assert set(events) <= {"create", "claim", "complete", "recheck"}, (key, events)
        assert events.count("complete") == (2 if key in redo else 1), (key, events)


@pytest.fixture
def article_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """``onceflow_ledger`` pointed at a fresh ledger (SQLite file or PostgreSQL database)."""
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def deferred_for_version(dag_id: str) -> bool:
    """Whether a task of ``dag_id`` was deferred to wait for another processing version."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        methods = session.scalars(select(TaskInstance.next_method).where(TaskInstance.dag_id == dag_id)).all()
    return "execute_after_version_wait" in methods


def test_the_article_step_runs_as_the_deployed_version_and_defers_an_item_that_needs_another(
    run_dag, sheets_emulator, article_ledger, monkeypatch
):
    """The version comes from the worker's deployment, not the run's conf; an old worker leaves a
    v2 item alone (deferred, not failed) and a v2 worker resuming the task finishes it."""
    from onceflow.sheets import ledger_link
    from onceflow.sheets.keys import normalise_url, row_key
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
    from onceflow.testing.dag_runner import load_dag

    url = f"https://news.example/{uuid.uuid4().hex[:8]}/1"
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, [url, "NEW"]]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    claim = queue.claim(1).claims[0]
    key = ledger_link.work_key(row_key(normalise_url(url)))
    monkeypatch.setenv("AIRFLOW__ONCEFLOW__WORKER_VERSION", "v1")  # this worker's deployment

    # a conf asking for another version changes nothing: the step runs as the deployed v1
    first = run_dag(
        "article_pipeline",
        conf={**claim.conf(sid, "queue", "v1"), "target_version": "v9"},
        mark_success_pattern=FIRST_STEP_ONLY,
    )
    assert first.state == "success", first.ti_states
    assert [r.processing_version for r in article_ledger.results(key)] == ["v1"]

    start_recheck(article_ledger, RecheckRequest("new_version", "model v2", "article", target_version="v2"))
    assert article_ledger.item(key).required_version == "v2"
    dag = load_dag("article_pipeline")
    dag.get_task("read_claimed_row").version_wait_seconds = 1

    def roll_out_v2() -> None:
        # the deferred task resumes on a worker of the new deployment once the old one gave it up
        deadline = time.monotonic() + 240  # generous: the machine is shared
        while time.monotonic() < deadline and not deferred_for_version("article_pipeline"):
            time.sleep(0.1)
        saw_deferral.append(deferred_for_version("article_pipeline"))
        os.environ["AIRFLOW__ONCEFLOW__WORKER_VERSION"] = "v2"

    saw_deferral: list[bool] = []
    rollout = threading.Thread(target=roll_out_v2, daemon=True)
    rollout.start()
    again = run_dag(
        dag,
        conf={**claim.conf(sid, "queue", "v1"), "target_version": "v2"},
        mark_success_pattern=FIRST_STEP_ONLY,
    )
    rollout.join(timeout=300)
    assert again.state == "success", again.ti_states
    assert saw_deferral == [True], "the v1 worker took (or failed) an item that requires v2"
    results = {r.processing_version: r for r in article_ledger.results(key)}
    assert sorted(results) == ["v1", "v2"]
    assert results["v2"].committed_by.startswith(f"article_pipeline/{again.run_id}/")
    events = [t.event for t in article_ledger.history(key)]
    assert events == ["create", "claim", "complete", "recheck", "claim", "complete"], events


def test_the_recheck_dispatch_runs_as_the_deployed_version_not_the_requested_one(
    run_dag, article_ledger, monkeypatch
):
    """A new_version recheck asks for v2 in its params; old code (v1) dispatches nothing and says
    so, without failing; the same DAG on a v2 deployment dispatches every item."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG("ledger_versions_chain", schedule=None, catchup=False) as chain:
        EmptyOperator(task_id="noop")
    assert run_dag(chain).state == "success"
    article_ledger.add_many("article", [f"art:{i}" for i in range(3)])
    for _ in range(3):
        article_ledger.commit_result(article_ledger.claim("article", "w", 60, "v1"), "publish", {})
    conf = {
        "scope": "new_version",
        "reason": "model v2",
        "kind": "article",
        "target_version": "v2",
        "chain_dag_id": "ledger_versions_chain",
    }

    monkeypatch.setenv("AIRFLOW__ONCEFLOW__WORKER_VERSION", "v1")
    old = run_dag("recheck", conf=conf)
    assert old.ti_states == {"start": "success", "dispatch": "success", "relay": "success"}
    assert old.xcom("start")["selected"] == 3
    assert old.xcom("dispatch")["completed"] == [] and old.xcom("dispatch")["worker_version"] == "v1"
    assert article_ledger.counts("article") == {"pending": 3}  # left for v2, not failed

    monkeypatch.setenv("AIRFLOW__ONCEFLOW__WORKER_VERSION", "v2")
    new = run_dag("recheck", conf={**conf, "scope": "stale", "reason": "nothing stale: only dispatch"})
    assert new.xcom("start")["selected"] == 0
    assert len(new.xcom("dispatch")["completed"]) == 3 and new.xcom("dispatch")["worker_version"] == "v2"
    assert article_ledger.counts("article") == {"done": 3}
