"""Translate: a backend interface (:class:`~onceflow.articles.translate.base.Translator`), chunking on
paragraph boundaries, and two real backends: Apertium (offline, the embedded default) and Google
Cloud Translation v3. Backends import their heavy clients inside functions. See ``docs/articles.md``.
"""

from __future__ import annotations

from onceflow.articles.translate.base import Chunks, Translation, Translator, chunk_paragraphs, translate_text

__all__ = ["Chunks", "Translation", "Translator", "chunk_paragraphs", "translate_text"]
