"""The whole article chain through ``dag.test()``: the real DAG, the Sheets emulator, the demo
article site on 127.0.0.1, real Apertium, the ledger on real PostgreSQL, files under tmp_path.

Nothing is mocked. Results are read back through paths the chain does not use: the emulator's
cells, the published file on disk and over HTTP from the demo site, the ledger's rows.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.ledger import Ledger, create_ledger_engine, schema
from onceflow.run_notes import RUN_NOTES
from onceflow.sheets import ledger_link
from onceflow.sheets.model import Snapshot
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.wakeup import wake_up
from onceflow.testing.article_site import ArticleSite, serve
from onceflow.testing.article_site.catalog import ARTICLES

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = pytest.mark.postgres

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
STEPS = ["read_claimed_row", "fetch", "extract", "translate", "score", "publish", "write_back"]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ArticleSite]:
    with serve(published_dir=tmp_path / "published") as running:
        yield running


@pytest.fixture
def chain_env(
    postgres_url: str, site: ArticleSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Ledger]:
    """The chain's connections: ledger (PostgreSQL), fetch (the demo site allowed), storage."""
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
    """The row whose status cell carries ``token`` (``DONE #<token>``), read from the emulator."""
    [row] = [r for r in Snapshot.from_values(emulator.values(sid, "queue")).rows if r.token == token]
    return row


def test_a_row_goes_from_new_to_done_with_a_link_to_its_page_published_once(
    run_dag: Any, chain_env: Ledger, site: ArticleSite, sheets_emulator: SheetsEmulator, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    url = site.url("/articles/huertos-urbanos.html")
    sid, [claim] = claimed(sheets_emulator, monkeypatch, [url])
    sheets_emulator.request_log.reset()  # the claim's share is counted in test_sheet_claim_budget.py
    run = run_dag("article_pipeline", conf=claim.conf(sid, "queue", "v1"))
    assert run.state == "success", run.ti_states
    # Sheets requests of the chain beyond the claim, from the emulator's request log:
    # read_claimed_row's write_fields (1 read by the anchor + 1 write) and write_back's relay pass
    # (1 read of the tab, with its id and rows' anchors; 2 writes)
    # (docs/articles.md#write-back-and-statuses)
    assert dict(sheets_emulator.request_log.counts) == {
        "values.batchGetByDataFilter": 1,
        "values.batchUpdateByDataFilter": 2,
        "spreadsheets.get": 1,
        "spreadsheets.batchUpdate": 1,
    }
    assert {t: run.ti_states[t] for t in STEPS} == dict.fromkeys(STEPS, "success")
    assert {t: run.ti_states[t] for t in ("polish", "mark_needs_review", "review")} == dict.fromkeys(
        ("polish", "mark_needs_review", "review"), "skipped"
    ), "a good translation goes straight to publish"
    assert all(n == 1 for t, n in run.try_numbers.items() if t in STEPS), run.try_numbers

    # the sheet, read straight from the emulator: DONE, a score, the link, no claim anchor left
    row = row_of(sheets_emulator, sid, claim.token)
    assert row.status.value == "DONE", row
    link = row.get("published_url")
    assert link.startswith(site.url("/published/articles/")) and link.endswith("/index.html")
    assert 0.7 <= float(row.get("score")) <= 1.0
    assert row.get("run_id") == run.run_id

    # exactly one published file, and the link serves it
    files = [p for p in (tmp_path / "published").rglob("*") if p.is_file()]
    assert len(files) == 1, files
    with urllib.request.urlopen(link, timeout=30) as resp:
        served = resp.read()
    assert served == files[0].read_bytes()
    page = served.decode()
    assert url in page, "the page links its source"
    assert "<script" not in page.lower()
    assert "*" not in page.split("<body", 1)[1], "Apertium's unknown-word markers are not published"

    # the ledger: one committed result per step, each naming its output by URI and sha256
    key = ledger_link.work_key(claim.row_key)
    results = {r.step: r for r in chain_env.results(key)}
    assert set(STEPS) <= set(results), sorted(results)
    assert "polish" not in results
    for step in ("fetch", "extract", "translate", "score"):
        payload = results[step].payload
        stored = Path(payload["uri"].removeprefix("file://")).read_bytes()
        assert hashlib.sha256(stored).hexdigest() == payload["sha256"], step
        # keyed by row key, version, step and the fencing token the result was committed under
        token = results[step].fencing_token
        assert f"/{claim.row_key}/v1/{step}.{token}." in payload["uri"], payload["uri"]
        assert results[step].committed_by.startswith(f"article_pipeline/{run.run_id}/")
    assert results["publish"].payload["url"] == link
    assert results["publish"].payload["sha256"] == hashlib.sha256(served).hexdigest()
    translation = json.loads(Path(results["translate"].payload["uri"].removeprefix("file://")).read_bytes())
    assert (translation["backend"], translation["source"], translation["target"]) == ("apertium", "es", "en")
    assert "kitchen garden" in translation["text"], translation["text"][:300]
    assert chain_env.item(key).state == "done"
    # the DONE was committed with publish's result and relayed from the outbox (sheets/relay.py)
    outbox = schema.outbox.c
    with chain_env.engine.connect() as conn:
        writes = conn.execute(
            sa.select(outbox.state, outbox.payload).where(
                outbox.work_key == key, outbox.target_type == "sheet_row"
            )
        ).all()
    assert [(state, json.loads(payload)["data"]["token"]) for state, payload in writes] == [
        ("relayed", claim.token)
    ]
    assert run.xcom("write_back")["relayed"] == 1, "write_back relayed it"

    # the run's note names the article by its page's title, written from the scheduler's side
    # (onceflow.run_notes): dag.test() ends the run through DagRun.update_state, which calls the
    # dag-run listeners; read back with plain SQL (the run was not created by sheet_claim, so it
    # had no note: the line is the title and the URL)
    assert RUN_NOTES.wait_idle(30, runs=[("article_pipeline", run.run_id)])
    title = ARTICLES["/articles/huertos-urbanos.html"].title
    assert results["extract"].payload["title"] == title
    assert run_note(run.run_id) == f"{title} — {url}"


def run_note(run_id: str) -> str | None:
    """The note of an ``article_pipeline`` run, read with plain SQL from the metadata database."""
    from airflow import settings

    with settings.engine.connect() as conn:
        found: str | None = conn.execute(
            sa.text(
                "SELECT n.content FROM dag_run_note n JOIN dag_run r ON r.id = n.dag_run_id "
                "WHERE r.dag_id = 'article_pipeline' AND r.run_id = :r"
            ),
            {"r": run_id},
        ).scalar()
    return found


BAD_URLS = [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
    ("http://localhost:9/admin", "127.0.0.1"),
    ("http://0x7f.1:9/", "127.0.0.1"),
    ("http://[::ffff:127.0.0.1]:9/", "127.0.0.1"),
]


@pytest.mark.parametrize(
    ("bad", "address"), BAD_URLS, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD_URLS)]
)
def test_an_ssrf_url_ends_failed_with_the_reason_on_the_row_and_no_retry(
    run_dag: Any, chain_env: Ledger, site: ArticleSite, sheets_emulator: SheetsEmulator,
    monkeypatch: pytest.MonkeyPatch, bad: str, address: str,
) -> None:  # fmt: skip
    before = site.connections
    sid, [claim] = claimed(sheets_emulator, monkeypatch, [bad])
    run = run_dag("article_pipeline", conf=claim.conf(sid, "queue", "v1"))
    assert run.state == "failed"
    assert run.ti_states["fetch"] == "failed" and run.try_numbers["fetch"] == 1, "no retry"
    assert run.ti_states["publish"] in ("upstream_failed", "skipped")
    row = row_of(sheets_emulator, sid, claim.token)
    assert row.status.value == "FAILED", row
    reason = row.get("reason")
    assert reason.startswith("fetch: ") and address in reason, reason
    item = chain_env.item(ledger_link.work_key(claim.row_key))
    assert item.state == "needs_correction" and address in (item.last_error or item.reason or "")
    assert site.connections == before, "nothing reached the demo site"


def test_urls_the_queue_refuses_never_reach_the_chain(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[::1]`` and a bare decimal host are INVALID at the claim already (no run is made for
    them); the fetch's own guard refuses them too (tests/integration/test_article_fetch.py)."""
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, ["http://[::1]:9/", "NEW"], ["http://2130706433:9/", "NEW"]]}
    )
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    result = wake_up(queue, None, 2).claim  # as sheet_claim: the verdicts leave as a relay writes them
    assert result.claims == []
    assert sorted(r.status.value for r in result.rejected) == ["INVALID", "INVALID"]
    rows = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows
    assert all(r.status.value == "INVALID" and "no valid host" in r.get("reason") for r in rows), rows


def test_a_redirect_to_a_private_address_and_a_non_html_file_fail_once_with_their_reason(
    run_dag: Any, chain_env: Ledger, site: ArticleSite, sheets_emulator: SheetsEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    urls = [site.url("/private-redirect"), site.url("/notes.pdf")]
    sid, claims = claimed(sheets_emulator, monkeypatch, urls)
    expected = {claims[0].url: "10.0.0.1", claims[1].url: "pdf"}
    for claim in claims:
        run = run_dag("article_pipeline", conf=claim.conf(sid, "queue", "v1"))
        assert run.state == "failed" and run.try_numbers["fetch"] == 1, run.ti_states
        row = row_of(sheets_emulator, sid, claim.token)
        assert row.status.value == "FAILED", row
        assert expected[claim.url] in row.get("reason").lower(), row.get("reason")


def test_a_server_that_asks_to_be_retried_later_is_waited_for_by_deferral_not_a_retry(
    run_dag: Any, chain_env: Ledger, site: ArticleSite, sheets_emulator: SheetsEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """429 with ``Retry-After: 2`` twice, then the page: the fetch task defers (holding no worker
    slot) for the server's time, fetches again as the same try, and the row ends DONE."""
    url = site.url("/busy/2?retry_after=2&to=/articles/huertos-urbanos.html")
    sid, [claim] = claimed(sheets_emulator, monkeypatch, [url])
    run = run_dag("article_pipeline", conf=claim.conf(sid, "queue", "v1"))
    assert run.state == "success", run.ti_states
    assert run.try_numbers["fetch"] == 1, "a deferral, not one of Airflow's retries"
    asks = site.requests_to("/busy/")
    assert [a.status for a in asks] == [429, 429, 200], asks
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(asks)]
    assert all(gap >= 2.0 for gap in gaps), f"fetched again before Retry-After: {gaps}"
    assert row_of(sheets_emulator, sid, claim.token).status.value == "DONE"
    [fetched] = [r for r in chain_env.results(ledger_link.work_key(claim.row_key)) if r.step == "fetch"]
    assert fetched.payload["uri"].startswith("file://")
