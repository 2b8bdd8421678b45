"""The article chain under a real Airflow (api-server, scheduler with LocalExecutor, dag-processor,
triggerer), with ``sheet_claim`` creating the runs from the emulated sheet, the demo article site
on 127.0.0.1, real Apertium, the ledger on PostgreSQL and published pages on disk.

* Crashes: the real task process is SIGKILLed after ``fetch`` committed, after ``translate``
  committed, and after ``publish`` wrote the page but before its commit (so before write-back).
  Airflow retries each; ``sheet_reconcile`` runs; exactly one published object, row DONE with the
  right link.
* Review: with the threshold between the demo pages' scores, three rows are DONE, two wait in
  NEEDS_REVIEW; the scheduler and the api-server are restarted; one is approved and one rejected
  through Airflow's REST API (``PATCH .../hitlDetails``); the approved one publishes, the
  rejected one ends REJECTED with the note. A Catalan page (no Apertium pair installed) ends
  FAILED with the reason, tried once.

Nothing is mocked; rows are read back from the emulator, pages from disk and over HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.articles.chain import markdown_text
from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.sheets import ledger_link
from onceflow.sheets.keys import normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import Snapshot
from onceflow.testing.article_site import ArticleSite, serve
from onceflow.testing.crash_points import DIR_ENV, POINTS_ENV, wait_until_paused

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = [pytest.mark.real_airflow, pytest.mark.postgres, pytest.mark.slow]

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
CHAIN = "article_pipeline"
POOLS = {"onceflow_sheets": 10, "onceflow_fetch": 4, "onceflow_translate": 2}


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ArticleSite]:
    with serve(published_dir=tmp_path / "published") as running:
        yield running


def _setup(
    tmp_path: Path,
    site: ArticleSite,
    emulator: SheetsEmulator,
    ledger_url: str,
    urls: list[str],
    *,
    crash: bool,
) -> tuple[Path, dict[str, str], str]:
    """DAG folder (the real DAG files; the chain's copy installs the crash points), env, sheet id."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("sheet_claim.py", "sheet_reconcile.py"):
        shutil.copy(REPO_DAGS / name, dags / name)
    source = (REPO_DAGS / "article_pipeline.py").read_text()
    if crash:
        source += "\nfrom onceflow.testing.crash_points import install_from_env\n\ninstall_from_env()\n"
    (dags / "article_pipeline.py").write_text(source)
    published = tmp_path / "published"
    published.mkdir(exist_ok=True)
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]]})
    env = {
        "AIRFLOW_CONN_ONCEFLOW_SHEETS": emulator.connection_json(spreadsheet_id=sid),
        "AIRFLOW_CONN_ONCEFLOW_LEDGER": json.dumps(
            {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
        ),
        "AIRFLOW_CONN_ONCEFLOW_FETCH": json.dumps(
            {"conn_type": "generic", "extra": {"allow": [site.address]}}
        ),
        "AIRFLOW_CONN_ONCEFLOW_STORAGE": json.dumps(
            {
                "conn_type": "google_cloud_platform",
                "extra": {
                    "base": (tmp_path / "steps").as_uri(),
                    "publish_base": published.as_uri(),
                    "public_url": site.url("/published"),
                },
            }
        ),
    }
    return dags, env, sid


def _rows(emulator: SheetsEmulator, sid: str) -> dict[str, Any]:
    """URL -> row, straight from the emulator's cells."""
    return {r.url: r for r in Snapshot.from_values(emulator.values(sid, "queue")).rows}


def _wait(predicate: Any, timeout: float, what: str, cluster: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(
        f"{what} did not happen in {timeout}s\n{cluster.log_tails()}\n{cluster.task_log_tails(CHAIN)}"
    )


def _published(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "published").rglob("*") if p.is_file())


def _tries(cluster: Any, run_id: str) -> dict[str, int]:
    rows = cluster.query(
        "SELECT task_id, try_number FROM task_instance WHERE dag_id = :d AND run_id = :r", d=CHAIN, r=run_id
    )
    return {r["task_id"]: int(r["try_number"]) for r in rows}


def _run_id(url: str) -> str:
    return pipeline_run_id(row_key(normalise_url(url)), "v1")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _kill_at(cluster: Any, folder: Path, stage: str) -> None:
    """Wait for try 1 to pause at ``stage`` and SIGKILL that task process."""
    pid = wait_until_paused(folder, CHAIN, stage, 1, timeout=600)
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not _alive(pid), 30, f"the task process killed at {stage}", cluster)


def test_sigkill_after_fetch_after_translate_and_after_the_publish_write_publishes_once(
    airflow_cluster_factory: Any,
    sheets_emulator: SheetsEmulator,
    postgres_url_factory: Any,
    site: ArticleSite,
    tmp_path: Path,
) -> None:
    url = site.url("/articles/biblioteca-movil.html")
    ledger_url = postgres_url_factory("chain_crash")
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    dags, env, sid = _setup(tmp_path, site, sheets_emulator, ledger_url, [url], crash=True)
    points = tmp_path / "points"
    points.mkdir()
    stages = ("fetch.committed", "translate.committed", "publish.stored")
    env[POINTS_ENV] = ",".join(f"{CHAIN}:{stage}:1" for stage in stages)
    env[DIR_ENV] = str(points)
    try:
        cluster = airflow_cluster_factory(dags_folder=dags, env=env, pools=POOLS)
        run_id = _run_id(url)
        for stage in stages:
            _kill_at(cluster, points, stage)
            if stage == "publish.stored":
                # the page is written, its ledger commit never happened, the row is not DONE yet
                assert len(_published(tmp_path)) == 1
                assert _rows(sheets_emulator, sid)[url].status.value == "PROCESSING"
        assert cluster.wait_for_run(CHAIN, run_id, timeout=900) == "success", cluster.task_log_tails(CHAIN)
        tries = _tries(cluster, run_id)
        assert (tries["fetch"], tries["translate"], tries["publish"]) == (2, 2, 2), tries
        assert (tries["extract"], tries["score"], tries["write_back"]) == (1, 1, 1), tries

        reconcile = cluster.trigger(
            "sheet_reconcile", conf={"lease_minutes": 0, "processing_version": "v1", "max_redrives": 3}
        )
        assert cluster.wait_for_run("sheet_reconcile", reconcile, timeout=300) == "success"

        [page] = _published(tmp_path)
        row = _rows(sheets_emulator, sid)[url]
        assert row.status.value == "DONE", row
        link = row.get("published_url")
        assert link == site.url("/published/" + page.relative_to(tmp_path / "published").as_posix())
        with urllib.request.urlopen(link, timeout=30) as resp:
            assert resp.read() == page.read_bytes()
        key = ledger_link.work_key(row_key(normalise_url(url)))
        results = [(r.step, r.fencing_token) for r in ledger.results(key)]
        steps = [step for step, _ in results]
        # one committed result per step: the killed tries after a commit added nothing
        assert sorted(steps) == sorted(
            ["read_claimed_row", "fetch", "extract", "translate", "score", "publish", "write_back"]
        ), results
        publish = next(r for r in ledger.results(key) if r.step == "publish")
        assert publish.payload["created"] is False, "the retry found the killed try's page and wrote nothing"
        assert publish.payload["url"] == link
        assert [r["run_id"] for r in cluster.dag_runs(CHAIN)] == [run_id]
    finally:
        engine.dispose()


def _hitl(cluster: Any, run_id: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """GET (or PATCH with ``body``) the review task's HITL detail through the public REST API."""
    with urllib.request.urlopen(f"{cluster.api_url}/auth/token", timeout=30) as resp:  # all-admins mode
        token = json.load(resp)["access_token"]
    request = urllib.request.Request(
        f"{cluster.api_url}/api/v2/dags/{CHAIN}/dagRuns/{run_id}/taskInstances/review/-1/hitlDetails",
        data=json.dumps(body).encode() if body is not None else None,
        method="PATCH" if body is not None else "GET",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return dict(json.load(resp))


def test_rows_done_one_review_approved_after_a_restart_one_rejected_with_its_note(
    airflow_cluster_factory: Any,
    sheets_emulator: SheetsEmulator,
    postgres_url_factory: Any,
    site: ArticleSite,
    tmp_path: Path,
) -> None:
    done = [site.url(f"/articles/{s}.html") for s in ("biblioteca-movil", "con-script", "titulo-formula")]
    approve, reject = site.url("/articles/historia-del-cafe.html"), site.url("/articles/gazpacho.html")
    catalan = site.url("/articles/festa-major.html")
    ledger_url = postgres_url_factory("chain_review")
    dags, env, sid = _setup(
        tmp_path, site, sheets_emulator, ledger_url, [*done, approve, reject, catalan], crash=False
    )
    # between the demo pages' scores (0.94, 0.96, 1.0 above; 0.912 and 0.914 below; no glossary)
    env["AIRFLOW_VAR_ONCEFLOW_SCORE_THRESHOLD"] = "0.93"
    cluster = airflow_cluster_factory(dags_folder=dags, env=env, pools=POOLS)

    def waiting_for_review(url: str) -> bool:
        rows = cluster.query(
            "SELECT state FROM task_instance WHERE dag_id = :d AND run_id = :r AND task_id = 'review'",
            d=CHAIN,
            r=_run_id(url),
        )
        return bool(rows) and rows[0]["state"] == "awaiting_input"

    _wait(
        lambda: waiting_for_review(approve) and waiting_for_review(reject), 900, "two reviews asked", cluster
    )
    for url in done:
        assert cluster.wait_for_run(CHAIN, _run_id(url), timeout=600) == "success"
    assert cluster.wait_for_run(CHAIN, _run_id(catalan), timeout=600) == "failed"
    rows = _rows(sheets_emulator, sid)
    assert {rows[u].status.value for u in done} == {"DONE"}
    assert {rows[u].status.value for u in (approve, reject)} == {"NEEDS_REVIEW"}
    assert "below 0.93" in rows[approve].get("reason"), rows[approve].get("reason")
    assert rows[catalan].status.value == "FAILED" and "cat-eng" in rows[catalan].get("reason")
    assert _tries(cluster, _run_id(catalan))["translate"] == 1, "a permanent failure is not retried"
    asked = _hitl(cluster, _run_id(approve))
    assert asked["response_received"] is False
    # what the reviewer sees: the score against the threshold, the source link, the text
    body = asked["body"]
    assert "**Score 0." in body and "(threshold 0.93)" in body and f"<{approve}>" in body, body[:500]
    assert "history of the coffee" in body.lower(), body[:500]
    assert len(_published(tmp_path)) == 3

    cluster.restart("scheduler", "api-server")
    assert waiting_for_review(approve) and waiting_for_review(reject), "the requests survived the restart"

    _hitl(cluster, _run_id(approve), {"chosen_options": ["Approve"], "params_input": {"note": ""}})
    note = "=Too literal; needs an editor"  # a note starting with '=' stays text
    _hitl(cluster, _run_id(reject), {"chosen_options": ["Reject"], "params_input": {"note": note}})
    assert cluster.wait_for_run(CHAIN, _run_id(approve), timeout=600) == "success"
    assert cluster.wait_for_run(CHAIN, _run_id(reject), timeout=600) == "success"

    rows = _rows(sheets_emulator, sid)
    assert rows[approve].status.value == "DONE", rows[approve]
    assert rows[reject].status.value == "REJECTED", rows[reject]
    assert rows[reject].get("reason").startswith(note), rows[reject].get("reason")
    published = _published(tmp_path)
    assert len(published) == 4, published  # three DONE, the approved one; nothing for the rejected
    for url in (*done, approve):
        link = rows[url].get("published_url")
        with urllib.request.urlopen(link, timeout=30) as resp:
            assert url in resp.read().decode(), "each page links its own source"
    assert rows[reject].get("published_url") == ""
    states = {
        r["task_id"]: r["state"]
        for r in cluster.query(
            "SELECT task_id, state FROM task_instance WHERE dag_id = :d AND run_id = :r",
            d=CHAIN,
            r=_run_id(reject),
        )
    }
    assert (states["review"], states["publish"], states["write_back"]) == ("success", "skipped", "skipped")

    # each run's note names its article: the real scheduler called onceflow's dag-run listener when
    # the run ended (onceflow.run_notes), which put the page's title (from extract's ledger result,
    # Markdown-escaped) in front of sheet_claim's "<URL> — claimed from row N"; the Catalan run
    # failed after extract and is titled too. Read with plain SQL from the metadata database.
    ledger = Ledger(create_ledger_engine(ledger_url))
    expected = {}
    for number, url in enumerate([*done, approve, reject, catalan], start=2):
        key = ledger_link.work_key(row_key(normalise_url(url)))
        [extract] = [r for r in ledger.results(key) if r.step == "extract"]
        expected[url] = f"{markdown_text(extract.payload['title'])} — {url} — claimed from row {number}"
    ledger.engine.dispose()

    def notes() -> dict[str, str | None]:
        rows = cluster.query(
            "SELECT r.run_id, n.content FROM dag_run r LEFT JOIN dag_run_note n ON n.dag_run_id = r.id "
            "WHERE r.dag_id = :d",
            d=CHAIN,
        )
        by_run = {r["run_id"]: r["content"] for r in rows}
        return {url: by_run.get(_run_id(url)) for url in expected}

    deadline = time.monotonic() + 60  # written a moment after each run ended
    while notes() != expected and time.monotonic() < deadline:
        time.sleep(1)
    assert notes() == expected
    assert expected[catalan].startswith("La festa major de Sant Pere de Riudebitlles — ")
    assert expected[done[2]].startswith(r"\=HYPERLINK\(\"https"), "a formula title stays text"
