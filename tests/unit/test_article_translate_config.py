"""A wrong ``onceflow_translate`` connection fails the translate task without retries (no retry
can fix a connection) and without marking the article's row: the article is not at fault."""

from __future__ import annotations

import json

import pytest


def test_a_bad_translate_connection_fails_the_task_without_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from onceflow.operators.articles import TranslateArticleOperator

    bad = {"conn_type": "generic", "extra": {"backend": "deepl"}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_TRANSLATE", json.dumps(bad))
    op = TranslateArticleOperator(task_id="translate")
    # the work never reaches the run's inputs: the connection is judged first
    with pytest.raises(AirflowFailException, match=r"backend.*deepl.*fix the connection"):
        op.work(None, {})  # type: ignore[arg-type]
