"""Score: how much a machine translation can be trusted, from signals that are really there.

Four parts, each in [0, 1]:

``known_words``
    ``1 - unknown / (0.15 * words)``, floored at 0: the share of words Apertium marked unknown
    (``*palabra``); 3% unknown scores 0.8, 15% or more scores 0. Google marks nothing, so it scores 1.
``target_language``
    lingua's confidence that the translation (markers removed) is in the target language.
``length``
    the translation's length over the source's (characters): 1 inside :data:`LENGTH_BAND`,
    falling in proportion outside it (half the lower bound scores 0.5).
``translated_sentences``
    ``1 - untranslated / sentences``: a sentence of the translation is untranslated when it is a
    copy of a source sentence (case and spacing aside, three words or more) or, with four words or
    more, lingua finds it in the source language. Left out when source and target are the same.

``value`` is the weighted mean (:data:`WEIGHTS`, re-normalized over the parts present), capped
at ``0.5 + 0.5 * min(parts)`` so that one failed signal alone pulls the score under the threshold,
rounded to four places. The chain polishes a translation below :data:`THRESHOLD` (0.75) and sends
it to review if it stays below: a copy of the source scores at most 0.4, a translation with 15%
or more of its words unknown at most 0.5, with 9% at most 0.7. ``reasons`` says, in one line each, which parts fell below
the threshold and why, and names the words the translator did not know whenever there are any (a
reviewer deciding about a 0.90 under a stricter publication threshold needs them). Deterministic: lingua is, and nothing else depends on the clock or chance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from onceflow.articles import language as lang
from onceflow.articles.translate.base import split_sentences

THRESHOLD = 0.75
WEIGHTS: dict[str, float] = {
    "known_words": 0.3,
    "target_language": 0.3,
    "length": 0.1,
    "translated_sentences": 0.3,
}
LENGTH_BAND = (0.5, 2.0)
UNKNOWN_ZERO = 0.15
_WORD = re.compile(r"\w[\w'\u2019-]*")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Score:
    """A translation's score, its parts (names as in :data:`WEIGHTS`) and the reasons it is low."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def _norm(sentence: str) -> str:
    return _SPACES.sub(" ", sentence).strip().casefold()


def _pct(x: float) -> str:
    return f"{round(100 * x)}%"


def score_translation(
    source_text: str,
    translated: str,
    *,
    source_lang: str,
    target_lang: str,
    unknown_marker: str = "*",
) -> Score:
    """Score ``translated`` against ``source_text``; see the module docstring for the formula.

    :param unknown_marker: what the backend puts before a word it did not know (Apertium: ``*``).
    """
    mark = re.escape(unknown_marker)
    marker = re.compile(rf"(?<![\w{mark}]){mark}(?=\w)")
    marked = re.compile(rf"(?<![\w{mark}]){mark}({_WORD.pattern})")
    clean = marker.sub("", translated)
    words = _WORD.findall(clean)
    if not words:
        return Score(0.0, dict.fromkeys(WEIGHTS, 0.0), ["the translation is empty"])
    parts: dict[str, float] = {}
    reasons: list[str] = []

    unknown = marked.findall(translated)
    share = len(unknown) / len(words)
    parts["known_words"] = max(0.0, 1.0 - share / UNKNOWN_ZERO)
    if unknown:
        shown = ", ".join(unknown_marker + w for w in sorted(set(unknown))[:5])
        reasons.append(f"{_pct(share)} of {len(words)} words unknown to the translator ({shown})")

    parts["target_language"] = lang.confidence(clean, target_lang, source_lang)
    if parts["target_language"] < THRESHOLD:
        reasons.append(f"only {_pct(parts['target_language'])} sure the text is in {target_lang!r}")

    ratio = len(clean.strip()) / max(1, len(source_text.strip()))
    low, high = LENGTH_BAND
    parts["length"] = 1.0 if low <= ratio <= high else (ratio / low if ratio < low else high / ratio)
    if parts["length"] < THRESHOLD:
        reasons.append(
            f"the translation is {ratio:.2f} times the source's length (expected {low:g} to {high:g})"
        )

    if source_lang != target_lang:
        copies = {_norm(s) for s in split_sentences(marker.sub("", source_text))}
        sentences = split_sentences(clean)
        left = 0
        for sentence in sentences:
            n_words = len(sentence.split())
            copied = n_words >= 3 and _norm(sentence) in copies
            if copied or (n_words >= 4 and lang.detect(sentence, source_lang, target_lang)[0] == source_lang):
                left += 1
        parts["translated_sentences"] = 1.0 - left / len(sentences) if sentences else 0.0
        if parts["translated_sentences"] < THRESHOLD:
            reasons.append(f"{left} of {len(sentences)} sentences left in {source_lang!r} or copied")

    total = sum(WEIGHTS[name] for name in parts)
    mean = sum(WEIGHTS[name] * parts[name] for name in parts) / total
    value = round(min(mean, 0.5 + 0.5 * min(parts.values())), 4)
    return Score(value, {name: round(v, 4) for name, v in parts.items()}, reasons)
