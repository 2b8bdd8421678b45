"""Issue 26 item 2: the review's form sends Approve with no note, and a Reject with no note is refused
with a message the UI shows, while the task keeps waiting.

Real parts: Airflow's own api-server app (``create_app``, with the plugins' root middlewares as the
api-server installs them) answers the HITL response on the session's metadata DB, while
``dag.test()`` runs the review task in a thread and waits in ``awaiting_input`` for that answer,
as the Required Actions page and the REST API make it. The review's params are
:class:`ArticleReviewOperator`'s own; the task is a plain ``ApprovalOperator`` with them, since
the article review needs the ledger and a sheet to build its body (the chain's cluster test
answers that one through a real api-server).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from onceflow.testing.dag_runner import run_dag


def _dag(dag_id: str) -> Any:
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.providers.standard.operators.hitl import ApprovalOperator
    from airflow.sdk import DAG

    from onceflow.operators.articles import ArticleReviewOperator

    params = ArticleReviewOperator(task_id="review").params
    with DAG(dag_id, schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)) as dag:
        review = ApprovalOperator(
            task_id="review", subject="Review", params=params, ignore_downstream_trigger_rules=True
        )
        review >> EmptyOperator(task_id="publish")
    return dag


@pytest.fixture(scope="module")
def client(onceflow_airflow_db: Any) -> Any:
    from airflow.api_fastapi.app import create_app
    from airflow.configuration import conf
    from fastapi.testclient import TestClient

    conf.set("core", "simple_auth_manager_all_admins", "True")
    client = TestClient(create_app(apps="core"), base_url="http://localhost:8080")
    token = client.get("/auth/token").json()["access_token"]
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def _answering(client: Any, dag_id: str, answer: Callable[[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Run ``dag_id``'s DAG with ``dag.test()`` in this thread (it parses and serializes here)
    while another thread waits for the review to ask and calls ``answer(url, run_id)`` through
    the API; what ``answer`` returned, or the exception it raised, comes back."""
    out: dict[str, Any] = {}

    def respond() -> None:
        try:
            out.update(answer(*_wait_for_request(client, dag_id)))
        except BaseException as exc:  # reported by the test, not lost in the thread
            out["error"] = exc

    thread = threading.Thread(target=respond, daemon=True)
    thread.start()
    run_dag(_dag(dag_id))
    thread.join(30)
    if "error" in out:
        raise out["error"]
    return out


def _wait_for_request(client: Any, dag_id: str) -> tuple[str, str]:
    """The review's HITL URL and its run id, once the task asks (``awaiting_input``)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        found = client.get(f"/api/v2/dags/{dag_id}/dagRuns/~/hitlDetails").json().get("hitl_details")
        if found:
            run_id = found[0]["task_instance"]["dag_run_id"]
            return f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/review/-1/hitlDetails", run_id
        time.sleep(0.5)
    pytest.fail("the review never asked")


def _states(dag_id: str, run_id: str) -> dict[str, str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(TaskInstance.task_id, TaskInstance.state).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
            )
        ).all()
    return {task: str(state) for task, state in rows}


@pytest.mark.slow  # ~3 min under load: the api-server app and two dag.test() runs
def test_reject_with_no_note_is_refused_with_its_reason_and_the_review_keeps_waiting(client: Any) -> None:
    dag_id = "review_reject_without_note"

    def answer(url: str, run_id: str) -> dict[str, Any]:
        seen: dict[str, Any] = {"run_id": run_id, "url": url}
        seen["schema"] = client.get(url).json()["params"]["note"]["schema"]
        # untouched, emptied, blank, left out
        for params in ({"note": None}, {"note": ""}, {"note": "   "}, {}):
            refused = client.patch(url, json={"chosen_options": ["Reject"], "params_input": params})
            seen.setdefault("refusals", []).append((refused.status_code, refused.json().get("detail")))
        seen["recorded"] = client.get(url).json()["response_received"]
        seen["state_while_refused"] = _states(dag_id, run_id)["review"]
        answered = client.patch(
            url, json={"chosen_options": ["Reject"], "params_input": {"note": "wrong glossary"}}
        )
        seen["answered"] = (answered.status_code, answered.text)
        return seen

    seen = _answering(client, dag_id, answer)
    assert seen["schema"]["x-onceflow-required-for"] == ["Reject"]
    for status, detail in seen["refusals"]:
        assert status == 449, (status, detail)
        assert "Reject needs 'note'" in detail and "still waiting" in detail
    assert seen["recorded"] is False  # nothing recorded
    assert seen["state_while_refused"] == "awaiting_input"
    assert seen["answered"][0] == 200, seen["answered"]
    assert _states(dag_id, seen["run_id"]) == {"review": "success", "publish": "skipped"}
    assert client.get(seen["url"]).json()["params_input"] == {"note": "wrong glossary"}


@pytest.mark.slow
def test_approve_with_an_empty_note_goes_through_and_the_chain_goes_on(client: Any) -> None:
    dag_id = "review_approve_without_note"

    def answer(url: str, run_id: str) -> dict[str, Any]:
        # what the UI sends for an untouched optional field
        resp = client.patch(url, json={"chosen_options": ["Approve"], "params_input": {"note": None}})
        return {"run_id": run_id, "answered": (resp.status_code, resp.text)}

    seen = _answering(client, dag_id, answer)
    assert seen["answered"][0] == 200, seen["answered"]
    assert _states(dag_id, seen["run_id"]) == {"review": "success", "publish": "success"}
