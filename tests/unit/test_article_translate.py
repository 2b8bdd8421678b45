"""Translate: chunking that never loses or reorders text, the real Apertium backend, and the hook."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.articles.errors import PermanentStepError
from onceflow.articles.translate import Translation, chunk_paragraphs, translate_text
from onceflow.articles.translate.apertium import ApertiumTranslator, strip_markers
from onceflow.hooks.translate import TranslateConfigError, TranslateHook

SPANISH = (
    "La biblioteca municipal abrirá los domingos a partir de enero. El horario será de diez de la mañana a "
    "dos de la tarde.\n\n"
    "Los lectores podrán devolver los libros en un buzón nuevo situado junto a la puerta principal.\n\n"
    "El concejal de cultura dijo que la medida responde a una petición de los estudiantes."
)

# text made of words, sentence ends, spaces, tabs, newlines and blank lines, in any mix
_TEXT = st.text(alphabet=st.sampled_from(list("abc xyz.!?\n\t»\rñé")), max_size=400)


class Upper:
    """A backend whose translation is visible and exact: it upper-cases each chunk, and records calls."""

    name = "upper"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def translate_chunks(self, chunks: list[str], source: str, target: str) -> list[str]:
        self.calls.append(list(chunks))
        return [c.upper() for c in chunks]


@settings(max_examples=400, deadline=None, database=None)
@given(text=_TEXT, max_chars=st.integers(min_value=1, max_value=60))
def test_chunks_rebuild_the_text_exactly_and_respect_the_limit(text, max_chars):
    chunks = chunk_paragraphs(text, max_chars)

    assert chunks.join(chunks) == text
    assert all(gap.strip() == "" for gap in chunks.gaps)  # no text hides between the chunks
    assert all(1 <= len(c) <= max_chars and c == c.strip() for c in chunks)


_WORD = st.text(alphabet="abcdefghij", min_size=1, max_size=8)
_PARAGRAPH = st.lists(_WORD, min_size=1, max_size=8).map(" ".join)


@settings(max_examples=300, deadline=None, database=None)
@given(
    paragraphs=st.lists(_PARAGRAPH, min_size=1, max_size=12),
    max_chars=st.integers(min_value=72, max_value=300),
)
def test_paragraphs_that_fit_are_never_cut_and_blank_lines_join_the_chunks(paragraphs, max_chars):
    text = "\n\n".join(paragraphs)

    chunks = chunk_paragraphs(text, max_chars)

    assert "\n\n".join(chunks) == text
    for chunk in chunks:  # every chunk is whole paragraphs
        assert all(p in paragraphs for p in chunk.split("\n\n"))


def test_a_long_paragraph_is_cut_at_sentence_ends_and_then_at_spaces():
    sentences = [f"Frase número {i} del párrafo largo." for i in range(20)]
    giant = "Palabra " * 30
    text = "Corto.\n\n" + " ".join(sentences) + "\n\n" + giant.strip()

    chunks = chunk_paragraphs(text, 80)

    assert chunks.join(chunks) == text
    long_part = [c for c in chunks if "Frase" in c]
    assert all(c.endswith("largo.") and c.startswith(("Frase", "Corto.")) for c in long_part)
    assert all(len(c) <= 80 for c in chunks)
    assert all(set(c.split()) == {"Palabra"} for c in chunks if "Palabra" in c)
    # packed greedily: the short paragraph and the first two sentences fit in 80
    assert chunks[0] == "Corto.\n\nFrase número 0 del párrafo largo. Frase número 1 del párrafo largo."


def test_a_word_longer_than_the_limit_is_hard_split():
    chunks = chunk_paragraphs("a" * 25, 10)

    assert list(chunks) == ["a" * 10, "a" * 10, "a" * 5]
    assert chunks.gaps == ("", "", "", "")


@settings(max_examples=200, deadline=None, database=None)
@given(text=_TEXT, max_chars=st.integers(min_value=1, max_value=40))
def test_translate_text_reassembles_the_translated_chunks_in_order(text, max_chars):
    backend = Upper()

    result = translate_text(backend, text, "es", "en", max_chars=max_chars)

    assert result.text == text.upper()
    assert result.chunks == len(chunk_paragraphs(text, max_chars))
    assert sum(len(call) for call in backend.calls) == result.chunks


def test_translate_text_leaves_a_text_already_in_the_target_language_alone():
    backend = Upper()

    result = translate_text(backend, "Already English.", "en", "en", max_chars=100)

    assert result == Translation("Already English.", 0, "none", "en", "en")
    assert backend.calls == []


def test_apertium_translates_real_spanish_and_keeps_paragraphs():
    result = translate_text(ApertiumTranslator("spa-eng"), SPANISH, "es", "en", max_chars=100)

    assert result.backend == "apertium" and result.chunks == 4  # the first paragraph is cut in two
    paragraphs = result.text.split("\n\n")
    assert len(paragraphs) == 3
    assert "library" in paragraphs[0] and "Sundays" in paragraphs[0]
    assert "readers" in paragraphs[1].lower()
    assert "culture" in paragraphs[2]
    assert "biblioteca" not in result.text


def test_apertium_marks_unknown_words_unless_told_not_to():
    text = "El zorblaxo del vecino come manzanas."

    marked = ApertiumTranslator("spa-eng").translate_chunks([text], "es", "en")[0]
    unmarked = ApertiumTranslator("spa-eng", mark_unknown=False).translate_chunks([text], "es", "en")[0]

    assert "*zorblaxo" in marked
    assert "zorblaxo" in unmarked and "*" not in unmarked
    assert strip_markers(marked) == unmarked


def test_apertium_refuses_a_pair_its_mode_does_not_translate_and_names_the_installed_ones():
    with pytest.raises(PermanentStepError) as failure:
        ApertiumTranslator("spa-eng").translate_chunks(["Bonjour."], "fr", "en")

    assert "spa-eng" in failure.value.reason and "fr->en" in failure.value.reason
    assert re.search(r"installed modes: .*eng-spa.*spa-eng", failure.value.reason)


def test_apertium_names_the_debian_packages_when_a_mode_is_missing():
    with pytest.raises(PermanentStepError) as failure:
        ApertiumTranslator.for_languages("fr", "en").translate_chunks(["Bonjour."], "fr", "en")

    assert "fra-eng is not installed" in failure.value.reason
    assert "'apertium-eng-spa'" in failure.value.reason and "'apertium'" in failure.value.reason


def test_apertium_names_the_debian_packages_when_the_command_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(PermanentStepError) as failure:
        ApertiumTranslator("spa-eng").translate_chunks(["Hola."], "es", "en")

    assert "'apertium' command is not on PATH" in failure.value.reason
    assert "'apertium-eng-spa'" in failure.value.reason


def _conn(monkeypatch, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", "extra": extra})
    )


def test_the_hook_defaults_to_apertium_when_the_connection_does_not_exist():
    hook = TranslateHook("onceflow_translate_not_defined")

    translator = hook.get_translator("es", "en")

    assert isinstance(translator, ApertiumTranslator) and translator.mode == "spa-eng"
    assert hook.max_chars == 10_000
    assert "library" in hook.translate(SPANISH, "es", "en").text


def test_the_hook_builds_the_google_backend_from_its_extras(monkeypatch):
    from onceflow.articles.translate.google_v3 import GoogleTranslator

    _conn(
        monkeypatch,
        "translate_google_t",
        {
            "backend": "google",
            "project_id": "p1",
            "location": "us-central1",
            "endpoint": "http://127.0.0.1:9",
            "glossary": "g",
        },
    )
    hook = TranslateHook("translate_google_t")

    translator = hook.get_translator("es", "en")

    assert isinstance(translator, GoogleTranslator)
    assert (translator.parent, translator.endpoint, translator.glossary) == (
        "projects/p1/locations/us-central1",
        "http://127.0.0.1:9",
        "g",
    )
    assert hook.max_chars == 5_000


def test_the_hook_takes_the_apertium_mode_and_chunk_size_from_its_extras(monkeypatch):
    _conn(
        monkeypatch, "translate_apertium_t", {"backend": "apertium", "mode": "spa-eng_US", "max_chars": 500}
    )
    hook = TranslateHook("translate_apertium_t")

    assert hook.get_translator("es", "en").mode == "spa-eng_US"  # type: ignore[attr-defined]
    assert hook.max_chars == 500


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"backend": "deepl"}, "extra 'backend' must be one of ['apertium', 'google'], not 'deepl'"),
        ({"backend": "google"}, "backend 'google' needs extra 'project_id'"),
        (
            {"backend": "google", "project_id": "p", "endpoint": "127.0.0.1:9"},
            "extra 'endpoint' must be an http(s) URL",
        ),
        (
            {"backend": "google", "project_id": "p", "mode": "spa-eng"},
            "unknown extra 'mode' for backend 'google'",
        ),
        ({"mode": "spanish-english"}, "extra 'mode': not an Apertium mode name: 'spanish-english'"),
        ({"max_chars": 0}, "extra 'max_chars' must be a positive number, not 0"),
        (
            {"backend": "google", "project_id": "p", "max_chars": 40_000},
            "'max_chars' must be a positive number of at most 30000",
        ),
        ({"timeout": "soon"}, "extra 'timeout' must be a positive number, not 'soon'"),
        ({"mark_unknown": "yes"}, "extra 'mark_unknown' must be true or false, not 'yes'"),
    ],
)
def test_the_hook_names_the_bad_extra(monkeypatch, extra, message):
    _conn(monkeypatch, "translate_bad_t", extra)

    with pytest.raises(TranslateConfigError) as failure:
        TranslateHook("translate_bad_t").get_translator("es", "en")

    assert "connection 'translate_bad_t'" in str(failure.value)
    assert message in str(failure.value)
