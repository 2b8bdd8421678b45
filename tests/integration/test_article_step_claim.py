"""A chain step mapped over a batch of claims: ``FetchArticleOperator.partial(...).expand(claim=...)``.

One ``dag.test()`` run (no conf) works on two articles, each mapped task instance on the claim it
was given in place of the run's conf. Real parts: the Sheets emulator, the demo article site on
127.0.0.1, the ledger on PostgreSQL, files under tmp_path. Read back with plain SQL on the
ledger's tables and from the stored files, not through the operators.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pendulum
import pytest
import sqlalchemy as sa
from airflow.sdk import DAG

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.operators.articles import ExtractArticleOperator, FetchArticleOperator
from onceflow.sheets.ledger_link import ClaimRecord, register_claims
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

if TYPE_CHECKING:
    from onceflow.testing.article_site import ArticleSite
    from onceflow.testing.sheets_fixtures import SheetsEmulator

pytestmark = pytest.mark.postgres

HEADER = ["url", "status", "reason", "run_id", "score", "published_url", "claim_token", "claimed_at"]
PAGES = ["/articles/huertos-urbanos.html", "/articles/gazpacho.html"]
TITLES = ["Los huertos urbanos de Valdeluna", "Gazpacho de la abuela Remedios"]


def test_a_step_mapped_over_two_claims_works_on_both_articles_in_one_run(
    run_dag: Any, postgres_url: str, article_site: ArticleSite, sheets_emulator: SheetsEmulator,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER",
        json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": postgres_url}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_STORAGE",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"base": (tmp_path / "steps").as_uri()}}),
    )
    urls = [article_site.url(p) for p in PAGES]
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, *[[u, "NEW"] for u in urls]]}
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    queue = SheetQueue(GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid), spread=1)
    claims = queue.claim(2).claims
    assert len(claims) == 2
    confs = [c.conf(sid, "queue", "v1") for c in claims]
    engine = create_ledger_engine(postgres_url)
    try:
        register_claims(
            Ledger(engine),
            [ClaimRecord(c.row_key, c.row_number, c.token, f) for c, f in zip(claims, confs, strict=True)],
        )

        with DAG("mapped_claims", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")) as dag:
            fetched = FetchArticleOperator.partial(task_id="fetch").expand(claim=confs)
            fetched >> ExtractArticleOperator.partial(task_id="extract").expand(claim=confs)
        run = run_dag(dag)  # no conf: each mapped task has only its claim
        assert run.state == "success", run.ti_states

        results = sa.table("results", sa.column("work_key"), sa.column("step"), sa.column("payload"),
                           sa.column("committed_by"))  # fmt: skip
        with engine.connect() as conn:
            rows = conn.execute(sa.select(results).where(results.c.step.in_(["fetch", "extract"]))).all()
    finally:
        engine.dispose()
    done = {(r.work_key, r.step) for r in rows}
    keys = {f"article:{c.row_key}" for c in claims}
    assert done == {(k, s) for k in keys for s in ("fetch", "extract")}, done
    assert all(r.committed_by.startswith(f"mapped_claims/{run.run_id}/") for r in rows)
    extracted = [json.loads(Path(payload_of(r)["uri"].removeprefix("file://")).read_bytes()) for r in rows
                 if r.step == "extract"]  # fmt: skip
    assert sorted(doc["title"] for doc in extracted) == sorted(TITLES), "each article its own page"


def payload_of(row: Any) -> dict[str, Any]:
    return row.payload if isinstance(row.payload, dict) else json.loads(row.payload)
