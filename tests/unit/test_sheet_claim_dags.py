"""The sheet-queue DAG files parse cheaply and carry owner, tags, doc_md and retries."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
#: the article chain's tasks that call Sheets, fetch pages or translate, and their pools
CHAIN_POOLS = {
    "read_claimed_row": "onceflow_sheets",
    "fetch": "onceflow_fetch",
    "translate": "onceflow_translate",
    "polish": "onceflow_sheets",
    "mark_needs_review": "onceflow_sheets",
    "write_back": "onceflow_sheets",
}


@pytest.mark.parametrize("dag_id", ["sheet_claim", "sheet_reconcile", "article_pipeline"])
def test_each_sheet_dag_parses_and_is_documented(dag_id: str) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS / f"{dag_id}.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags[dag_id]
    assert dag.doc_md and len(dag.doc_md) > 200
    assert "onceflow" in dag.tags and "sheet-queue" in dag.tags
    for task in dag.tasks:
        assert task.owner == "onceflow"
        assert task.retries >= 1
        assert task.pool == CHAIN_POOLS.get(task.task_id, task.pool), f"{task.task_id} outside its pool"
        if dag_id != "article_pipeline":
            assert task.pool == "onceflow_sheets", f"{task.task_id} does sheet I/O outside the sheets pool"


def test_article_pipeline_is_the_whole_chain() -> None:
    """Every step of the chain, in order, each task that calls Sheets in the sheets pool and the
    fetches and translations in their own pools (their quotas are not the sheet's)."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(str(DAGS / "article_pipeline.py")).dags["article_pipeline"]
    assert "later issue" not in (dag.doc_md or "")
    order = ["read_claimed_row", "fetch", "extract", "translate", "score", "check_score"]
    for upstream, downstream in itertools.pairwise(order):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    assert dag.get_task("check_score").downstream_task_ids == {"publish", "polish"}
    assert dag.get_task("check_polished").downstream_task_ids == {"publish", "mark_needs_review"}
    assert dag.get_task("review").downstream_task_ids == {"publish"}
    assert dag.get_task("publish").downstream_task_ids == {"write_back"}
    for task_id, pool in CHAIN_POOLS.items():
        assert dag.get_task(task_id).pool == pool
