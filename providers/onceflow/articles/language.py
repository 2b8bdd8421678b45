"""Language detection for the article chain: one lingua detector per process, on a small language set.

lingua ships its models in the wheel (offline) and is deterministic: the same text gives the same
answer. Restricting it to the languages the chain meets (:data:`DEFAULT_LANGUAGES`) keeps it fast
and keeps it from answering a rare language for a short ambiguous sentence. A code outside that set
is added to the set for the call that needs it (that set's detector is built once and cached).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

#: ISO 639-1 codes the detector knows by default: the demo site's languages and their neighbours.
DEFAULT_LANGUAGES: frozenset[str] = frozenset({"ca", "de", "en", "es", "fr", "it", "pt"})


@lru_cache(maxsize=8)
def _detector(codes: frozenset[str]) -> Any:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    languages = [Language.from_iso_code_639_1(IsoCode639_1.from_str(code)) for code in sorted(codes)]
    return LanguageDetectorBuilder.from_languages(*languages).with_preloaded_language_models().build()


def warm() -> None:
    """Build the default languages' detector now (``onceflow.preload``: in the process that forks
    the task processes, so ``extract`` and ``score`` find it built)."""
    _detector(_codes())


def _codes(*extra: str | None) -> frozenset[str]:
    from lingua import IsoCode639_1

    wanted = set(DEFAULT_LANGUAGES)
    for code in extra:
        if code:
            try:
                IsoCode639_1.from_str(code)
            except ValueError:
                continue  # a language lingua does not know cannot be detected: leave it out
            wanted.add(code)
    return frozenset(wanted)


def normalize_code(tag: str | None) -> str | None:
    """``es-ES``, ``ES``, ``es_419`` -> ``es``; ``None`` or an unusable tag -> ``None``."""
    if not tag:
        return None
    primary = tag.strip().replace("_", "-").split("-", 1)[0].lower()
    return primary if primary.isalpha() and len(primary) in (2, 3) else None


def detect(text: str, *also: str | None) -> tuple[str | None, float]:
    """The most likely language of ``text`` (ISO 639-1) and lingua's confidence in it (0..1).

    :param also: codes to add to the default set for this call (the languages the caller expects).
    """
    values = _detector(_codes(*also)).compute_language_confidence_values(text)
    if not values or values[0].value <= 0.0:
        return None, 0.0
    return values[0].language.iso_code_639_1.name.lower(), float(values[0].value)


def confidence(text: str, code: str, *also: str | None) -> float:
    """lingua's confidence (0..1) that ``text`` is in language ``code``.

    :raises ValueError: when lingua does not know ``code``.
    """
    from lingua import IsoCode639_1, Language

    language = Language.from_iso_code_639_1(IsoCode639_1.from_str(code))
    return float(_detector(_codes(code, *also)).compute_language_confidence(text, language))
