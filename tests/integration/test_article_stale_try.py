"""An outdated try of an article step cannot write the row (issue 22, defect 4).

A try whose lease was taken over (its worker paused past the lease; a newer try leased the item)
then hits a permanent error. The ledger refuses its ``needs_correction`` (stale fence), and the
row must not be written either: it used to be marked FAILED, the newer try's DONE then found it
FAILED and the row stayed FAILED with no link, which reconcile takes as final. The row's FAILED
now leaves through the ledger's outbox, committed with ``needs_correction``: the stale try
cannot commit, so no relay pass (the chain's, ``sheet_claim``'s) ever sees a FAILED for it.

Real ledger (SQLite file or PostgreSQL by ``ledger_url``), real Sheets emulator over HTTP, the
real operator's ``execute``; only the Airflow task context is a plain namespace (the attributes the
operator reads), because the point is what the operator does after its lease was taken over.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.articles.errors import PermanentStepError
from onceflow.articles.writeback import done_fields
from onceflow.hooks.sheets import SheetQueueHook
from onceflow.ledger import Ledger, StaleFenceError
from onceflow.ledger.db import create_ledger_engine
from onceflow.ledger.outbox import pending_sheet_rows
from onceflow.operators.article_step import ArticleStepOperator
from onceflow.sheets import ledger_link
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.relay import relay_sheet_rows, row_write
from onceflow.testing.clock import FakeClock

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onceflow.articles.chain import StepRun
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
URL = "https://news.example.com/stale-try"


@pytest.fixture
def article_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


class _PausedThenTooSlow(ArticleStepOperator):
    """A step whose worker pauses past its lease (a newer try takes the item over meanwhile) and
    then fails permanently."""

    step = "fetch"
    requires_extra = None
    newer: Any = None  # the newer try's lease

    def work(self, run: StepRun, context: Any) -> dict[str, Any]:
        later = Ledger(run.ledger.engine, clock=FakeClock(start=time.time() + 3600), migrate=False)
        type(self).newer = later.lease_key(
            "article", run.work_key, "newer-try", 600, run.version, reopen_reason="-"
        )
        raise PermanentStepError("fetch: too slow (120 s)", step="fetch")


def test_defect4_a_try_whose_lease_was_taken_over_does_not_mark_the_row_failed(
    sheets_emulator: SheetsEmulator, article_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, [URL, "NEW"]]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    [claim] = SheetQueueHook(spreadsheet_id=sid).queue("v1").claim(1).claims
    conf = claim.conf(sid, "queue", "v1")
    ti = SimpleNamespace(dag_id="article_pipeline", run_id="manual__1", try_number=1, task_id="fetch")
    context: Any = {"ti": ti, "dag_run": SimpleNamespace(conf=conf)}
    operator = _PausedThenTooSlow(task_id="fetch", lease_seconds=60)

    def relay() -> Any:  # a pass as sheet_claim's wake-up makes it
        return relay_sheet_rows(
            article_ledger, lambda _sid, _tab: SheetQueueHook(spreadsheet_id=sid).queue("v1")
        )

    with pytest.raises(StaleFenceError):  # not the permanent error: this try no longer owns the item
        operator.execute(context)
    assert pending_sheet_rows(article_ledger) == [], "the stale try committed no write-back"
    assert relay().relayed == 0
    row = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows[0]
    assert row.status is Status.PROCESSING, f"the outdated try wrote the row: {row.status_cell.raw!r}"
    assert row.get("reason") == ""

    # the newer try publishes: its commit carries the row's DONE, and the relay writes it
    item = article_ledger.item(ledger_link.work_key(claim.row_key))
    assert (item.state, item.lease_owner, item.fencing_token) == ("leased", "newer-try", 2)
    link = "http://127.0.0.1/published/a"
    fields = done_fields(score=0.9, published_url=link, run_id="manual__2")
    write = row_write(f"{sid}/queue", claim.token, Status.DONE, fields, row_key=claim.row_key)
    article_ledger.commit_result(_PausedThenTooSlow.newer, "publish", {"url": link}, [write])
    report = relay()
    assert report.written == [claim.token], report
    row = Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows[0]
    assert row.status is Status.DONE and row.get("published_url") == link
