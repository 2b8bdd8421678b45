"""Translate: chunking that never loses or reorders text, the real Apertium backend, and the hook."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onceflow
from onceflow.articles.errors import PermanentStepError, TransientStepError
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
# (and the Unicode whitespace real pages carry: no-break, ideographic and line-separator spaces)
_TEXT = st.text(alphabet=st.sampled_from(list("abc xyz.!?\n\t»\rñé\u00a0\u3000\u2028")), max_size=400)


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


def test_a_paragraph_ending_in_a_no_break_space_keeps_its_break_in_a_gap():
    # "<p>Hola mundo&nbsp;</p>": the no-break space used to end a piece, which left an empty piece
    # carrying the blank line, so the next chunk began with it and the backend's strip() lost it
    chunks = chunk_paragraphs("Hola mundo\u00a0\n\nOtro", 10)

    assert list(chunks) == ["Hola mundo", "Otro"]
    assert chunks.gaps == ("", "\u00a0\n\n", "")


def test_a_long_run_of_spaces_around_one_newline_is_chunked_at_all():
    # the paragraph-break search was quadratic in the run's length (minutes for these 200 KB):
    # run in a child with a bound far above the linear cost, far below the quadratic one
    code = (
        "from onceflow.articles.translate.base import chunk_paragraphs\n"
        "text = 'a' + ' ' * 100_000 + '\\n' + ' ' * 100_000 + 'b'\n"
        "chunks = chunk_paragraphs(text, 10_000)\n"
        "assert list(chunks) == ['a', 'b'] and chunks.join(chunks) == text\n"
    )
    # this checkout's code first, after whatever the session put there (the network guard's site)
    paths = [str(Path(onceflow.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=env
    )

    assert done.returncode == 0, done.stderr


def test_apertium_keeps_the_paragraph_break_after_a_no_break_space():
    text = "Hola mundo\u00a0\n\nOtro"

    translated = translate_text(ApertiumTranslator("spa-eng"), text, "es", "en", max_chars=10)

    assert translated.text == "Hello World\u00a0\n\nAnother"


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


def test_apertium_keeps_the_characters_its_stream_format_reserves():
    text = "Precio: 30 [oferta] <b>50%</b> ^ $ \\ @usuario #etiqueta / fin."

    [out] = ApertiumTranslator("spa-eng").translate_chunks([text], "es", "en")

    for kept in ("[", "]", "<", ">", "50%", "^", "$", "\\", "@", "#", "/"):
        assert kept in out


def test_apertium_translates_past_the_characters_its_stream_reads_as_control():
    # U+FFFF ended Apertium's output there (the rest of the chunk silently lost); NUL glued the
    # words around it into one unknown word
    [out] = ApertiumTranslator("spa-eng").translate_chunks(
        ["La casa\uffffgrande. El perro\x00come."], "es", "en"
    )

    assert "house" in out and "big" in out and "dog" in out and "eats" in out
    assert "*" not in out


def test_apertium_past_its_timeout_is_transient():
    with pytest.raises(TransientStepError) as failure:
        ApertiumTranslator("spa-eng", timeout=0.001).translate_chunks([SPANISH], "es", "en")

    assert "apertium spa-eng took over 0.001 s on chunk 1 of 1" in failure.value.reason


def _fake_apertium(tmp_path, body: str) -> str:
    """An ``apertium`` stand-in (a hang or broken output cannot be provoked from the real one):
    lists ``spa-eng`` for ``-l``, else runs ``body``."""
    script = tmp_path / "apertium"
    script.write_text(f'#!/bin/bash\nif [ "$1" = "-l" ]; then echo spa-eng; exit 0; fi\n{body}\n')
    script.chmod(0o755)
    return str(script)


def _state(pid: int) -> str | None:
    """The process's state letter (``S``, ``Z``...), ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return None


def test_apertium_past_its_timeout_leaves_no_process_of_its_pipeline_running(tmp_path):
    # apertium is a shell script running a pipeline: killing the script alone orphaned the pipeline
    pidfile = tmp_path / "pipeline.pid"
    binary = _fake_apertium(tmp_path, f"sleep 300 &\necho $! > {pidfile}\nwait")
    translator = ApertiumTranslator("spa-eng", timeout=2, binary=binary)

    with pytest.raises(TransientStepError, match="took over 2 s on chunk 1 of 1"):
        translator.translate_chunks(["Hola."], "es", "en")

    pid = int(pidfile.read_text())
    try:
        for _ in range(100):  # the group was SIGKILLed: wait for init to reap the orphan
            if _state(pid) in (None, "Z"):
                break
            time.sleep(0.05)
        assert _state(pid) in (None, "Z"), "the pipeline of the timed-out apertium is still running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_apertium_output_that_is_not_utf8_is_a_permanent_failure_with_a_reason(tmp_path):
    binary = _fake_apertium(tmp_path, "cat > /dev/null\nprintf 'ok \\xff\\xfe'")

    with pytest.raises(PermanentStepError) as failure:
        ApertiumTranslator("spa-eng", binary=binary).translate_chunks(["Hola."], "es", "en")

    assert "apertium spa-eng wrote invalid UTF-8 for chunk 1 of 1" in failure.value.reason


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


def test_apertium_keeps_the_layout_of_an_extracted_article_across_chunks():
    paragraphs = [
        "El mercado central abrirá una nueva sección de productos locales. Los agricultores de la comarca "
        "venderán frutas y verduras de temporada todos los sábados.",
        "- Horario de mañana: de ocho a dos\n- Horario de tarde: de cinco a ocho",
        "Día | Puestos\nLunes | Doce\nSábado | Treinta",
        "La concejala de comercio dijo que el proyecto costará poco dinero.",
    ]
    text = "\n\n".join(paragraphs)

    result = translate_text(ApertiumTranslator("spa-eng"), text, "es", "en", max_chars=90)

    out = result.text.split("\n\n")
    assert result.chunks >= 4 and len(out) == len(paragraphs)
    assert out[1].splitlines()[0].startswith("- ") and len(out[1].splitlines()) == 2
    assert [line.count("|") for line in out[2].splitlines()] == [1, 1, 1]
    assert out[2].startswith("Day | ") and "Saturday | " in out[2]
    assert "market" in out[0] and "Saturdays" in out[0]
