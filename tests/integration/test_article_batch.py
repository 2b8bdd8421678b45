"""The batch lane through ``dag.test()``: one ``article_batch`` run, each task carrying one step for
every article of the batch; the Sheets emulator, the demo article site on 127.0.0.1, real
Apertium, the ledger on real PostgreSQL, files under tmp_path. Nothing is mocked.

Read back through paths the lane does not use: the emulator's cells, the published files on disk,
the ledger's rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.sheets import ledger_link
from onceflow.sheets.keys import BATCH_RUN_KEY, batch_run_id
from onceflow.sheets.model import Snapshot
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.article_site import ArticleSite, serve

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

BATCH = "article_batch"
HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
STEPS = ["read_claimed_row", "fetch", "extract", "translate", "score", "publish", "write_back"]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ArticleSite]:
    with serve(published_dir=tmp_path / "published") as running:
        yield running


@pytest.fixture
def ledger_env(
    postgres_url: str, site: ArticleSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Ledger]:
    """The lane's connections: ledger (PostgreSQL), fetch (the demo site allowed), storage."""
    published = tmp_path / "published"
    published.mkdir(exist_ok=True)
    conns = {
        "ONCEFLOW_LEDGER": {"conn_type": "postgres", "extra": {"sqlalchemy_url": postgres_url}},
        "ONCEFLOW_FETCH": {"conn_type": "generic", "extra": {"allow": [site.address]}},
        "ONCEFLOW_STORAGE": {
            "conn_type": "google_cloud_platform",
            "extra": {
                "base": (tmp_path / "steps").as_uri(),
                "publish_base": published.as_uri(),
                "public_url": site.url("/published"),
            },
        },
    }
    for name, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{name}", json.dumps(conn))
    engine = create_ledger_engine(postgres_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def claimed(
    emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch, urls: list[str]
) -> tuple[str, list[Any]]:
    """A queue with ``urls`` as NEW rows, all claimed (as ``sheet_claim`` would): id and claims."""
    sid = emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", emulator.connection_json(spreadsheet_id=sid))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid), spread=1)
    result = queue.claim(len(urls))
    assert len(result.claims) == len(urls), result.rejected
    return sid, list(result.claims)


def row_of(emulator: SheetsEmulator, sid: str, token: str) -> Any:
    """The row whose status cell carries ``token``, read from the emulator."""
    [row] = [r for r in Snapshot.from_values(emulator.values(sid, "queue")).rows if r.token == token]
    return row


def batch_conf(ledger: Ledger, sid: str, claims: list[Any]) -> dict[str, Any]:
    """Register ``claims`` for one batch as ``sheet_claim`` does; the batch run's conf."""
    run_id = batch_run_id(claims[0].token)
    confs = [{**c.conf(sid, "queue", "v1"), BATCH_RUN_KEY: run_id} for c in claims]
    records = [
        ledger_link.ClaimRecord(c.row_key, c.row_number, c.token, f)
        for c, f in zip(claims, confs, strict=True)
    ]
    assert len(ledger_link.register_claims(ledger, records)) == len(claims)
    return {"claims": confs}


def test_one_articles_permanent_failure_never_fails_the_others_and_a_busy_server_is_waited_for(
    run_dag: Any, ledger_env: Ledger, site: ArticleSite, sheets_emulator: SheetsEmulator, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    good = [site.url(f"/articles/{p}.html") for p in ("huertos-urbanos", "biblioteca-movil")]
    missing = site.url("/status/404")
    catalan = site.url("/articles/festa-major.html")  # no cat-eng pair installed: translate refuses
    busy = site.url("/busy/2?retry_after=1&to=/articles/tren-nocturno.html")  # two 429s, then the page
    urls = [*good, missing, catalan, busy]
    sid, claims = claimed(sheets_emulator, monkeypatch, urls)
    by_url = {c.url: c for c in claims}
    conf = batch_conf(ledger_env, sid, claims)
    sheets_emulator.request_log.reset()

    run = run_dag(BATCH, conf=conf)

    assert run.state == "success", run.ti_states
    # one try of every task: the failures stayed with their articles, the 429s were waited for
    assert {t: run.try_numbers[t] for t in STEPS} == dict.fromkeys(STEPS, 1), run.try_numbers
    assert {t: run.ti_states[t] for t in STEPS} == dict.fromkeys(STEPS, "success")
    # every page that was translated scores above the threshold: polish and review never start
    assert {t: run.ti_states[t] for t in ("polish", "mark_needs_review")} == dict.fromkeys(
        ("polish", "mark_needs_review"), "skipped"
    )

    done = [*good, busy]
    for url in done:
        row = row_of(sheets_emulator, sid, by_url[url].token)
        assert row.status.value == "DONE", (url, row)
        assert row.get("run_id") == run.run_id
        assert row.get("published_url").startswith(site.url("/published/articles/"))
    failed = row_of(sheets_emulator, sid, by_url[missing].token)
    assert failed.status.value == "FAILED" and "404" in failed.get("reason"), failed
    # the fetch step ran three times (two waits for the busy server); the 404 was asked once:
    # a permanent failure leaves the batch for good
    assert [a.path for a in site.requests_to("/status/404")] == ["/status/404"]
    refused = row_of(sheets_emulator, sid, by_url[catalan].token)
    assert refused.status.value == "FAILED" and "cat-eng" in refused.get("reason"), refused

    files = sorted(p for p in (tmp_path / "published").rglob("*") if p.is_file())
    assert len(files) == len(done), files

    # the ledger: each article its own fenced steps, one result per step, under its own tokens
    for url in done:
        key = ledger_link.work_key(by_url[url].row_key)
        results = ledger_env.results(key)
        assert sorted(r.step for r in results) == sorted(STEPS), (url, [r.step for r in results])
        assert all(r.committed_by.startswith(f"{BATCH}/{run.run_id}/") for r in results)
        tokens = [r.fencing_token for r in results]
        assert len(set(tokens)) == len(tokens), "each step leased the article anew (token + 1)"
    assert ledger_env.item(ledger_link.work_key(by_url[missing].row_key)).state == "needs_correction"
    catalan_steps = [r.step for r in ledger_env.results(ledger_link.work_key(by_url[catalan].row_key))]
    assert catalan_steps == ["read_claimed_row", "fetch", "extract"], catalan_steps

    # Sheets requests of the whole batch (five rows): 1 read + 1 write to read every row back and
    # write the run id beside it, one relay pass for the FAILED rows of each step that had one
    # (fetch, translate) and one for the DONE rows (1 read of the tab with its id and its rows'
    # anchors + 1 field write + 1 status batch each)
    counts = dict(sheets_emulator.request_log.counts)
    assert counts.get("values.batchGetByDataFilter", 0) == 1, counts
    assert counts.get("spreadsheets.get", 0) == 3, counts
    assert counts.get("values.batchUpdateByDataFilter", 0) == 1 + 3, counts
    assert counts.get("spreadsheets.batchUpdate", 0) == 3, counts


def test_a_transient_failure_is_retried_for_that_article_alone_and_dropped_on_the_last_try(
    run_dag: Any, ledger_env: Ledger, site: ArticleSite, sheets_emulator: SheetsEmulator, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from datetime import timedelta

    import pendulum
    from airflow.sdk import chain, dag

    from onceflow.operators import article_batch as ops

    good = site.url("/articles/huertos-urbanos.html")
    # a 503 without Retry-After once, then the page: Airflow's retry, for this article alone
    flaky = site.url("/busy/1?status=503&retry_after=&to=/articles/gazpacho.html")
    dead = site.url("/status/503")  # never recovers: dropped on the last try, the rest go on
    sid, claims = claimed(sheets_emulator, monkeypatch, [good, flaky, dead])
    by_url = {c.url: c for c in claims}
    conf = batch_conf(ledger_env, sid, claims)

    @dag(
        dag_id=f"batch_retries_{tmp_path.name}",
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        default_args={"owner": "onceflow", "retries": 1, "retry_delay": timedelta(seconds=1)},
    )
    def batch_retries() -> None:
        chain(
            ops.ClaimedRowBatchOperator(task_id="read_claimed_row"),
            ops.FetchBatchOperator(task_id="fetch"),
            ops.ExtractBatchOperator(task_id="extract"),
            ops.TranslateBatchOperator(task_id="translate"),
            ops.ScoreBatchOperator(task_id="score"),
            ops.PublishBatchOperator(task_id="publish"),
            ops.WriteBackBatchOperator(task_id="write_back"),
        )

    run = run_dag(batch_retries(), conf=conf)

    assert run.state == "success", run.ti_states
    assert run.try_numbers["fetch"] == 2, "the first try left two articles for the retry"
    assert {t: run.try_numbers[t] for t in STEPS if t != "fetch"} == dict.fromkeys(set(STEPS) - {"fetch"}, 1)
    for url in (good, flaky):
        assert row_of(sheets_emulator, sid, by_url[url].token).status.value == "DONE", url
    # the dead server's row stays in flight, for sheet_reconcile to re-drive alone past the lease
    assert row_of(sheets_emulator, sid, by_url[dead].token).status.value == "PROCESSING"
    item = ledger_env.item(ledger_link.work_key(by_url[dead].row_key))
    assert item.state == "pending" and "503" in str(item.last_error), item
    # the good article was fetched once: the retry repeated its committed result
    good_key = ledger_link.work_key(by_url[good].row_key)
    fetches = [
        h for h in ledger_env.history(good_key) if h.event == "claim" and str(h.owner).endswith("/fetch")
    ]
    assert len(fetches) == 1, fetches
