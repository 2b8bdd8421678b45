"""The sheet-queue DAG files parse cheaply and carry owner, tags, doc_md and retries."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


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
        assert task.pool == "onceflow_sheets", f"{task.task_id} does sheet I/O outside the sheets pool"


def test_article_pipeline_says_the_chain_is_still_to_come() -> None:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(str(DAGS / "article_pipeline.py")).dags["article_pipeline"]
    assert "later issue" in (dag.doc_md or "")
    assert [t.task_id for t in dag.tasks] == ["read_claimed_row"]
