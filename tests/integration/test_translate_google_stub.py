"""The real google-cloud-translate client (REST) against the local Cloud Translation v3 stub.

Nothing is mocked: ``GoogleTranslator`` builds a real ``TranslationServiceClient`` that sends HTTP
to :mod:`onceflow.testing.translate_stub`; results are checked against the stub's request log.
"""

from __future__ import annotations

import json
import socket

import pytest

from onceflow.articles.errors import PermanentStepError, TransientStepError
from onceflow.articles.translate import translate_text
from onceflow.articles.translate.google_v3 import MAX_CHARS, GoogleTranslator
from onceflow.hooks.translate import TranslateHook
from onceflow.testing.translate_stub import serve, untag

PROJECT = "onceflow-test"
SPANISH = (
    "La alcaldesa inauguró ayer la nueva biblioteca del barrio.\n\n"
    "Los vecinos podrán usarla todos los días de la semana."
)


def _paragraphs(n: int, size: int) -> str:
    words = "palabra " * (size // 8)
    return "\n\n".join(f"{i} {words}".strip() + "." for i in range(n))


def test_the_real_client_translates_through_the_stub_with_apertium():
    with serve(PROJECT, engine="apertium") as stub:
        result = translate_text(
            GoogleTranslator(PROJECT, endpoint=stub.url), SPANISH, "es", "en", max_chars=MAX_CHARS
        )

        assert result.backend == "google" and result.chunks == 1
        assert "mayor" in result.text and "library" in result.text and "neighbours" in result.text
        assert result.text.count("\n\n") == 1
        [request] = stub.log
        assert request.path.startswith(f"/v3/projects/{PROJECT}/locations/global:translateText")
        assert request.body == {
            "contents": [SPANISH],
            "mimeType": "text/plain",
            "sourceLanguageCode": "es",
            "targetLanguageCode": "en",
        }


def test_a_long_text_is_batched_within_the_code_point_limit_and_reassembled_in_order():
    text = _paragraphs(80, 900)  # about 72,000 code points: three requests at 30,000
    with serve(PROJECT, engine="tag") as stub:
        result = translate_text(
            GoogleTranslator(PROJECT, endpoint=stub.url), text, "es", "en", max_chars=MAX_CHARS
        )

        sizes = [sum(len(c) for c in r.body["contents"]) for r in stub.log]  # type: ignore[index]
        assert len(stub.log) == 3 and all(r.status == 200 for r in stub.log)
        assert all(size <= 30_000 for size in sizes)
        assert all(len(c) <= MAX_CHARS for r in stub.log for c in r.body["contents"])  # type: ignore[index]
    # the tag engine prefixes each chunk: removing the prefixes gives the text back exactly, in order
    assert result.chunks == sum(len(r.body["contents"]) for r in stub.log)  # type: ignore[index]
    assert "\n\n".join(untag(p) for p in result.text.split("\n\n")) == text


def test_requests_carry_at_most_the_segment_limit():
    with serve(PROJECT, engine="tag", max_segments=3) as stub:
        translator = GoogleTranslator(PROJECT, endpoint=stub.url, max_segments=3)

        out = translator.translate_chunks([f"Frase {i}." for i in range(7)], "es", "en")

        assert [len(r.body["contents"]) for r in stub.log] == [3, 3, 1]  # type: ignore[index]
    assert out == [f"[en] Frase {i}." for i in range(7)]


def test_the_stub_refuses_a_request_over_the_limit_like_google_and_that_is_permanent():
    with serve(PROJECT, engine="tag") as stub:
        greedy = GoogleTranslator(PROJECT, endpoint=stub.url, max_codepoints=100_000)

        with pytest.raises(PermanentStepError) as failure:
            greedy.translate_chunks(["a" * 20_000, "b" * 20_000], "es", "en")

        assert [r.status for r in stub.log] == [400]
    assert "(400): Text too long: 40000 code points > 30000" in failure.value.reason


def test_a_429_is_transient_and_carries_retry_after_then_the_next_attempt_succeeds():
    with serve(PROJECT, engine="tag") as stub:
        translator = GoogleTranslator(PROJECT, endpoint=stub.url)
        stub.fail_next(429, retry_after=7)

        with pytest.raises(TransientStepError) as failure:
            translator.translate_chunks(["Hola."], "es", "en")
        again = translator.translate_chunks(["Hola."], "es", "en")

        assert [r.status for r in stub.log] == [429, 200]
    assert failure.value.retry_after == 7.0 and failure.value.step == "translate"
    assert "429" in failure.value.reason
    assert again == ["[en] Hola."]


def test_a_retry_after_no_one_can_wait_for_is_left_out():
    # "Retry-After: inf" became retry_after=inf, which no retry can be scheduled with
    with serve(PROJECT, engine="tag") as stub:
        stub.fail_next(429, retry_after=float("inf"))

        with pytest.raises(TransientStepError) as failure:
            GoogleTranslator(PROJECT, endpoint=stub.url).translate_chunks(["Hola."], "es", "en")

        assert [r.status for r in stub.log] == [429]
    assert failure.value.retry_after is None and "429" in failure.value.reason


def test_a_503_is_transient():
    with serve(PROJECT, engine="tag") as stub:
        stub.fail_next(503)

        with pytest.raises(TransientStepError) as failure:
            GoogleTranslator(PROJECT, endpoint=stub.url).translate_chunks(["Hola."], "es", "en")

    assert "503" in failure.value.reason and failure.value.retry_after is None


def test_a_request_past_its_deadline_is_transient():
    with serve(PROJECT, engine="tag") as stub:
        stub.delay_next(3)

        with pytest.raises(TransientStepError) as failure:
            GoogleTranslator(PROJECT, endpoint=stub.url, timeout=0.5).translate_chunks(["Hola."], "es", "en")

    assert "unreachable" in failure.value.reason and "timed out" in failure.value.reason.lower()


def test_an_unreachable_endpoint_is_transient():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    with pytest.raises(TransientStepError) as failure:
        GoogleTranslator(PROJECT, endpoint=f"http://127.0.0.1:{port}", timeout=5).translate_chunks(
            ["Hola."], "es", "en"
        )

    assert "unreachable" in failure.value.reason


def test_a_403_is_permanent():
    with serve(PROJECT, engine="tag") as stub, pytest.raises(PermanentStepError) as failure:
        GoogleTranslator("someone-elses-project", endpoint=stub.url).translate_chunks(["Hola."], "es", "en")

    assert "(403): Permission denied on project someone-elses-project" in failure.value.reason


def test_a_glossary_is_applied_and_an_unknown_one_is_permanent():
    with serve(PROJECT, engine="apertium") as stub:
        stub.add_glossary("city-terms", {"alcaldesa": "regidora"})

        [with_glossary] = GoogleTranslator(
            PROJECT, endpoint=stub.url, glossary="city-terms"
        ).translate_chunks([SPANISH.split("\n\n")[0]], "es", "en")
        with pytest.raises(PermanentStepError) as failure:
            GoogleTranslator(PROJECT, endpoint=stub.url, glossary="nope").translate_chunks(
                ["Hola."], "es", "en"
            )

        assert stub.log[0].body["glossaryConfig"] == {  # type: ignore[index]
            "glossary": f"projects/{PROJECT}/locations/global/glossaries/city-terms"
        }
    assert "regidora" in with_glossary and "mayor" not in with_glossary
    assert "(404): Glossary not found" in failure.value.reason


def test_the_hook_reaches_the_stub_from_the_connection_extras(monkeypatch):
    with serve(PROJECT, engine="apertium") as stub:
        extra = {"backend": "google", "project_id": PROJECT, "endpoint": stub.url}
        monkeypatch.setenv(
            "AIRFLOW_CONN_TRANSLATE_STUB_T", json.dumps({"conn_type": "generic", "extra": extra})
        )

        result = TranslateHook("translate_stub_t").translate(SPANISH, "es", "en")

        assert len(stub.log) == 1
    assert result.backend == "google" and "library" in result.text
