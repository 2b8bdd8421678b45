"""What a reviewer meets (issue 26 items 2 and 3): a form Approve can be sent with no note, and a
body that says why the article waits and shows the text readers will get."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from markdown_it import MarkdownIt

from onceflow.articles.chain import review_markdown, why_below
from onceflow.operators.articles import ArticleReviewOperator, responder_name


def _ui_requires(schema: dict[str, Any]) -> bool:
    """Airflow 3.3's UI rule for a required form field (FlexibleForm: ``isRequired``): a param
    whose schema has a type that does not allow null. Required fields grey out the HITL buttons."""
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def test_the_note_is_not_required_so_approve_works_with_an_empty_form() -> None:
    op = ArticleReviewOperator(task_id="review")
    [(name, param)] = op.serialized_params.items()
    assert name == "note"
    assert not _ui_requires(param["schema"]), param
    assert param["value"] is None
    assert "Reject" in param["description"] and "Approve needs none" in param["description"]
    op.validate_params_input({"note": None})  # what the UI sends for an untouched field
    op.validate_params_input({"note": "wrong glossary"})


def test_the_responders_name_comes_from_the_answer() -> None:
    answer = {"chosen_options": ["Approve"], "responded_by_user": {"id": "7", "name": "ada"}}
    assert responder_name(answer) == "ada"
    assert responder_name({"responded_by_user": None}) is None
    assert responder_name(None) is None


def test_a_score_under_a_strict_threshold_with_no_scorer_reason_still_says_why() -> None:
    parts = {"known_words": 0.87, "target_language": 0.97, "length": 1.0, "translated_sentences": 1.0}
    lines = why_below([], parts)
    assert lines == [
        "words the translator knew: 0.87 of 1.00",
        "confidence the text is in the target language: 0.97 of 1.00",
    ]
    body = review_markdown(
        {"title": "El *bibliobús", "text": "The *bibliobús arrives on Mondays.", "backend": "apertium"},
        0.90,
        ["2% of 50 words unknown to the translator (*bibliobús)"],
        "http://127.0.0.1:8765/articles/biblioteca-movil.html",
        0.92,
        parts,
    )
    shown = MarkdownIt("commonmark").render(body)  # what the UI renders
    assert "no reasons given" not in shown
    assert "<li>words the translator knew: 0.87 of 1.00</li>" in shown
    assert "(*bibliobús)" in shown  # the reason names the unknown word...
    text_part = shown.split("readers will see it", 1)[1]
    assert "The bibliobús arrives on Mondays." in text_part  # ...the text readers get has no marker
    assert "*" not in text_part
    assert "Approve to publish this translation (no note needed)" in shown


def _guarded(monkeypatch: Any, stored: dict[str, Any] | None) -> Any:
    """The guard in front of an app that records what reached it; the stored request is given
    (the slow test tests/integration/test_review_note_required_to_reject.py reads the real one)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from onceflow import hitl_guard

    monkeypatch.setattr(hitl_guard, "_stored_params", lambda *a: stored)
    app = FastAPI()
    app.state.seen = []

    @app.patch("/api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/{mi}/hitlDetails")
    async def respond(request: Request) -> dict[str, Any]:  # Request at module level: FastAPI reads it
        body = await request.body()
        app.state.seen.append(json.loads(body) if body.startswith(b"{") else body)
        return {"ok": True}

    app.add_middleware(hitl_guard.RequiredForOptionGuard)
    return TestClient(app)


URL = "/api/v2/dags/article_pipeline/dagRuns/sheet__1/taskInstances/review/-1/hitlDetails"


def test_the_review_note_is_required_to_reject_and_only_to_reject(monkeypatch: Any) -> None:
    client = _guarded(monkeypatch, ArticleReviewOperator(task_id="review").serialized_params)
    for note in (None, "", "  "):
        refused = client.patch(URL, json={"chosen_options": ["Reject"], "params_input": {"note": note}})
        assert refused.status_code == 449
        assert refused.json()["detail"].startswith("Reject needs 'note': type why")
    approve = {"chosen_options": ["Approve"], "params_input": {"note": None}}
    assert client.patch(URL, json=approve).status_code == 200
    reject = {"chosen_options": ["Reject"], "params_input": {"note": "wrong glossary"}}
    assert client.patch(URL, json=reject).status_code == 200
    assert client.app.state.seen == [approve, reject]  # the body reached Airflow unchanged


def test_other_hitl_tasks_and_malformed_bodies_pass_to_airflow(monkeypatch: Any) -> None:
    plain = {"note": {"value": None, "schema": {"type": ["null", "string"]}}}
    client = _guarded(monkeypatch, plain)
    assert client.patch(URL, json={"chosen_options": ["Reject"], "params_input": {}}).status_code == 200
    answered = _guarded(monkeypatch, None)  # answered already, or no request: Airflow says so
    assert answered.patch(URL, json={"chosen_options": ["Reject"]}).status_code == 200
    assert answered.patch(URL, content=b"not json").status_code == 200  # Airflow answers it (422)
    assert answered.app.state.seen[-1] == b"not json"
    assert answered.get(URL).status_code == 405  # only PATCH is looked at
