"""What a reviewer meets (issue 26 items 2 and 3): a form Approve can be sent with no note, and a
body that says why the article waits and shows the text readers will get."""

from __future__ import annotations

from typing import Any

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
