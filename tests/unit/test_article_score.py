"""Score: real Apertium output of real Spanish text, scored from its real signals."""

from __future__ import annotations

import pytest

from onceflow.articles.score import THRESHOLD, score_translation
from onceflow.articles.translate import translate_text
from onceflow.articles.translate.apertium import ApertiumTranslator

SPANISH = """El ayuntamiento aprobó ayer un plan para mejorar el transporte público durante los próximos cinco años. El proyecto incluye tres nuevas líneas de autobús y la ampliación del horario nocturno del metro.

Según la alcaldesa, la inversión total será de cuarenta millones de euros. La mayor parte del dinero saldrá de los presupuestos regionales, y el resto vendrá de fondos europeos.

Los vecinos de los barrios del norte llevaban años pidiendo más frecuencias. Muchos trabajadores tardan más de una hora en llegar al centro cada mañana.

La oposición criticó que el plan no incluya carriles para bicicletas. Sus portavoces dijeron que votarán en contra si el texto final no cambia antes del verano."""

# Spanish grammar around words no dictionary has: Apertium marks each one unknown
MADE_UP = """El trasgolino de Murvela plifaba los brunteros del caseral con una zordina muy frelosa. Los
grimantes y las pluvetas del vardal quisieron espolcar la tronfela antes del brisco.

Según el moscalero, la vindrala era demasiado crumbosa para los zelfos del tarpal. Nadie sabía si
el flurmo iba a torlar las besmitas o a dejar el crovel en la fantosa del zumbral."""


def _apertium(text: str) -> str:
    return translate_text(ApertiumTranslator("spa-eng"), text, "es", "en", max_chars=10_000).text


@pytest.fixture(scope="module")
def good() -> str:
    return _apertium(SPANISH)


def test_a_real_apertium_translation_scores_high(good):
    score = score_translation(SPANISH, good, source_lang="es", target_lang="en")

    assert score.value >= THRESHOLD
    assert score.parts["known_words"] == 1.0  # Apertium knew every word
    assert score.parts["target_language"] > 0.9
    assert score.parts["length"] == 1.0
    assert score.parts["translated_sentences"] == 1.0
    assert score.reasons == []


def test_many_words_unknown_to_apertium_score_low_and_say_which():
    translated = _apertium(MADE_UP)
    assert translated.count("*") >= 10  # the markers are really there

    score = score_translation(MADE_UP, translated, source_lang="es", target_lang="en")

    assert score.value < THRESHOLD
    assert score.parts["known_words"] == 0.0
    [reason] = [r for r in score.reasons if "words unknown to the translator" in r]
    assert reason.startswith("36% of 67 words") and "*brunteros" in reason


def test_the_same_text_without_markers_loses_that_signal():
    """The unknown-word part really reads Apertium's markers (without them it cannot see the problem)."""
    unmarked = translate_text(
        ApertiumTranslator("spa-eng", mark_unknown=False), MADE_UP, "es", "en", max_chars=10_000
    )

    score = score_translation(MADE_UP, unmarked.text, source_lang="es", target_lang="en")

    assert score.parts["known_words"] == 1.0


def test_an_untranslated_copy_scores_low():
    score = score_translation(SPANISH, SPANISH, source_lang="es", target_lang="en")

    assert score.value < THRESHOLD
    assert score.parts["translated_sentences"] == 0.0
    assert score.parts["target_language"] < 0.1
    assert any("8 of 8 sentences left in 'es'" in r for r in score.reasons)


def test_half_the_paragraphs_left_in_spanish_count_as_untranslated_sentences(good):
    source_paragraphs = SPANISH.split("\n\n")
    mixed = "\n\n".join([*good.split("\n\n")[:2], *source_paragraphs[2:]])

    score = score_translation(SPANISH, mixed, source_lang="es", target_lang="en")

    assert score.parts["translated_sentences"] == 0.5
    assert score.value < THRESHOLD


def test_a_translation_far_shorter_than_its_source_loses_on_length(good):
    first_sentence = good.split(". ")[0] + "."

    score = score_translation(SPANISH, first_sentence, source_lang="es", target_lang="en")

    assert score.parts["length"] < 0.5
    assert any("times the source's length" in r for r in score.reasons)
    assert score.value < THRESHOLD


def test_it_is_deterministic(good):
    first = score_translation(SPANISH, good, source_lang="es", target_lang="en")

    assert all(
        score_translation(SPANISH, good, source_lang="es", target_lang="en") == first for _ in range(3)
    )


def test_an_empty_translation_scores_zero():
    score = score_translation(SPANISH, "  \n ", source_lang="es", target_lang="en")

    assert score.value == 0.0
    assert score.reasons == ["the translation is empty"]


def test_a_text_that_needed_no_translation_is_scored_without_the_untranslated_part():
    english = "The harbour brings back the night ferries after two years of works on the pier."

    score = score_translation(english, english, source_lang="en", target_lang="en")

    assert "translated_sentences" not in score.parts
    assert score.value >= THRESHOLD
