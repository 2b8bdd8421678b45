"""Which committed result a chain step reads as its input (``StepRun.result``).

A step reads only what *its own run* committed at *its* processing version: never an output of
another run (a recheck run of the same article, the other lane) and never an uncommitted one. The
ledger keeps one result per step and version, so a second run's commit of a step takes that
input away from the first run, which then fails loudly (``MissingResult``) instead of building
on the other run's output. Real ledger (SQLite; the PostgreSQL behaviour is the ledger's own
tests'), nothing mocked; the stale commit is read back with plain SQL.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from onceflow.articles.chain import MissingResult, StepRun
from onceflow.ledger import StaleFenceError
from onceflow.ledger.steps import run_keyed_step

KEY = "article:k1"
A, B = "article_pipeline/sheet__k1__v1/", "article_pipeline_recheck/recheck__k1/"


def _commit(ledger: Any, prefix: str, payload: dict[str, Any], version: str = "v1") -> None:
    run_keyed_step(
        ledger, kind="article", work_key=KEY, step="fetch", owner=f"{prefix}1/fetch",
        worker_version=version, work=lambda lease: payload, reuse_prefix=prefix,
    )  # fmt: skip


def _view(ledger: Any, prefix: str, version: str = "v1") -> StepRun:
    return StepRun(ledger, KEY, "k1", version, {}, "run", prefix)


def test_a_step_reads_its_own_runs_committed_result_only(sqlite_ledger: Any) -> None:
    _commit(sqlite_ledger, A, {"uri": "a"})
    assert _view(sqlite_ledger, A).result("fetch") == {"uri": "a"}
    with pytest.raises(MissingResult):
        _view(sqlite_ledger, B).result("fetch")  # another run's output is not this run's input
    assert _view(sqlite_ledger, B).result("fetch", required=False) == {}
    with pytest.raises(MissingResult):
        _view(sqlite_ledger, A, "v2").result("fetch")  # nor is another version's

    # the recheck run commits the same step at the same version: the first run loses its input
    # and says so, rather than reading the recheck's page
    _commit(sqlite_ledger, B, {"uri": "b"})
    assert _view(sqlite_ledger, B).result("fetch") == {"uri": "b"}
    with pytest.raises(MissingResult, match="no 'fetch' result committed by this run"):
        _view(sqlite_ledger, A).result("fetch")


def test_a_stale_try_cannot_commit_over_the_try_that_took_its_lease(
    sqlite_ledger: Any, fake_clock: Any
) -> None:
    """A try killed (or frozen) after its output write loses its lease to the retry; its late
    commit is refused and the retry's result is the one the next step reads."""
    stale: list[Any] = []

    def frozen(lease: Any) -> dict[str, str]:
        stale.append(lease)
        fake_clock.advance(1000)  # past the lease: the retry takes over meanwhile
        _commit(sqlite_ledger, A, {"uri": "retry"})
        return {"uri": "stale"}

    with pytest.raises(StaleFenceError):
        run_keyed_step(
            sqlite_ledger, kind="article", work_key=KEY, step="extract_probe", owner=f"{A}1/x",
            worker_version="v1", work=frozen, lease_seconds=60, reuse_prefix=A,
        )  # fmt: skip
    with sqlite_ledger.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, payload FROM results WHERE work_key = :k ORDER BY step"), {"k": KEY}
        ).all()
    assert [(s, p) for s, p in rows] == [("fetch", '{"uri": "retry"}')], "the stale payload was never stored"
    assert _view(sqlite_ledger, A).result("fetch") == {"uri": "retry"}
