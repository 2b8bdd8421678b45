"""The backend interface, and chunking a text on paragraph boundaries without losing a character.

A backend translates a list of chunks, each at most ``max_chars`` code points (its API's limit).
:func:`chunk_paragraphs` packs whole paragraphs (blocks separated by a blank line) into chunks; a
paragraph longer than ``max_chars`` is cut at sentence ends, and a sentence still too long at the
last whitespace before the limit, else at the limit itself. A chunk never starts or ends with
whitespace: the whitespace between chunks (``"\\n\\n"`` between paragraphs, a space between
sentences) is kept in :attr:`Chunks.gaps`, so ``chunks.join(chunks) == text`` always, and
``chunks.join(translated)`` puts the translations back in order with the original layout. For a
text whose paragraphs fit and are separated by exactly one blank line,
``"\\n\\n".join(chunks) == text`` too.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

# a blank line, with any whitespace but a newline around it (a paragraph ending in "&nbsp;" too:
# its no-break space belongs to the break, else it ends a piece that then carries the break away).
# It starts only where a run of such whitespace starts: tried from every space of a long run, with
# one newline and no blank line after it, the search was quadratic (minutes for 100 KB of spaces).
_PARAGRAPH_BREAK = re.compile(r"(?<![^\S\n])[^\S\n]*+\n[^\S\n]*+\n\s*")
# a sentence ends with . ! ? … (and closing quotes or brackets, which stay with it), then whitespace
_SENTENCE_END = re.compile(r"[.!?\u2026][\"'\u00bb\u201d\u2019)\]]*(\s+)")


class Translator(Protocol):
    """A translation backend.

    :attr name: the backend's name, recorded with the translation (``apertium``, ``google``).
    """

    name: str

    def translate_chunks(self, chunks: list[str], source: str, target: str) -> list[str]:
        """Translate each chunk from ``source`` to ``target`` (ISO 639-1); same length, same order.

        :raises onceflow.articles.errors.PermanentStepError: the pair or the text cannot be translated.
        :raises onceflow.articles.errors.TransientStepError: try again later (quota, outage).
        """
        ...


@dataclass(frozen=True)
class Translation:
    """A translated text and how it was made."""

    text: str
    chunks: int
    backend: str
    source: str
    target: str


class Chunks(list[str]):
    """The chunks of a text, plus the whitespace around and between them.

    ``gaps`` has one more entry than there are chunks: ``gaps[0]`` before the first chunk,
    ``gaps[i]`` between chunk ``i - 1`` and chunk ``i``, ``gaps[-1]`` after the last.
    """

    def __init__(self, chunks: Sequence[str], gaps: Sequence[str]) -> None:
        super().__init__(chunks)
        if len(gaps) != len(chunks) + 1:
            raise ValueError(f"{len(chunks)} chunks need {len(chunks) + 1} gaps, not {len(gaps)}")
        self.gaps: tuple[str, ...] = tuple(gaps)

    def join(self, pieces: Sequence[str]) -> str:
        """``pieces`` (one per chunk, in order) with this text's whitespace between them."""
        if len(pieces) != len(self):
            raise ValueError(f"{len(self)} chunks but {len(pieces)} pieces")
        out = [self.gaps[0]]
        for piece, gap in zip(pieces, self.gaps[1:], strict=True):
            out += [piece, gap]
        return "".join(out)


def _split(text: str, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """``text`` (no outer whitespace) cut at ``pattern``: (piece, the separator after it).

    The separator is the pattern's group 1 if it has one (what comes before it stays in the piece).
    """
    out: list[tuple[str, str]] = []
    start = 0
    group = 1 if pattern.groups else 0
    for match in pattern.finditer(text):
        if match.start(group) > start and match.end(group) < len(text):
            out.append((text[start : match.start(group)], match.group(group)))
            start = match.end(group)
    out.append((text[start:], ""))
    return out


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, paragraph by paragraph, without the whitespace between them."""
    out: list[str] = []
    for paragraph, _ in _split(text.strip(), _PARAGRAPH_BREAK):
        out += [sentence for sentence, _ in _split(paragraph, _SENTENCE_END) if sentence.strip()]
    return out


def _hard_split(text: str, max_chars: int) -> list[tuple[str, str]]:
    """Cut at the last whitespace run before ``max_chars``, else at ``max_chars``."""
    out: list[tuple[str, str]] = []
    rest = text
    while len(rest) > max_chars:
        head = rest[: max_chars + 1]
        spaces = list(re.finditer(r"\s+", head))
        cut = next((m for m in reversed(spaces) if 0 < m.start() <= max_chars), None)
        if cut is None:
            out.append((rest[:max_chars], ""))
            rest = rest[max_chars:]
        else:
            out.append(
                (rest[: cut.start()], rest[cut.start() : cut.end()] + _leading_space(rest[cut.end() :]))
            )
            rest = rest[cut.end() :].lstrip()
    out.append((rest, ""))
    return out


def _leading_space(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _pieces(paragraph: str, max_chars: int) -> list[tuple[str, str]]:
    """A paragraph (no outer whitespace) as pieces of at most ``max_chars``, with their separators."""
    if len(paragraph) <= max_chars:
        return [(paragraph, "")]
    out: list[tuple[str, str]] = []
    for sentence, sep in _split(paragraph, _SENTENCE_END):
        parts = _hard_split(sentence, max_chars)
        parts[-1] = (parts[-1][0], sep)
        out += parts
    return out


def chunk_paragraphs(text: str, max_chars: int) -> Chunks:
    """Chunks of at most ``max_chars`` code points, cut on paragraph boundaries where possible.

    Paragraphs (and the sentences of a paragraph too long for one chunk) are packed greedily into
    chunks, with the whitespace between them; see the module docstring for longer paragraphs and
    for what :class:`Chunks` keeps to rebuild the text.

    :param text: the text; any whitespace is kept, in the chunks or in their gaps.
    :param max_chars: the most code points in one chunk (at least 1).
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, not {max_chars}")
    body = text.strip()
    if not body:
        return Chunks([], [text])
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(lead) + len(body) :]
    pieces: list[tuple[str, str]] = []  # (piece, the separator after it)
    for paragraph, brk in _split(body, _PARAGRAPH_BREAK):
        parts = _pieces(paragraph, max_chars)
        parts[-1] = (parts[-1][0], brk)
        pieces += parts
    chunks: list[str] = []
    gaps = [lead]
    current = pieces[0][0]
    for (_, sep), (piece, _) in itertools.pairwise(pieces):
        if len(current) + len(sep) + len(piece) <= max_chars:
            current += sep + piece  # greedy packing: fewer requests, cut only where needed
        else:
            chunks.append(current)
            gaps.append(sep)
            current = piece
    chunks.append(current)
    gaps.append(trail)
    return Chunks(chunks, gaps)


def translate_text(
    translator: Translator, text: str, source: str, target: str, *, max_chars: int
) -> Translation:
    """Translate ``text`` chunk by chunk and put it back together in order, layout kept.

    A text already in the target language (``source == target``) is returned as it is, without
    calling the backend (``backend="none"``).

    :raises ValueError: when the backend returns a different number of chunks than it was given.
    """
    if source == target:
        return Translation(text=text, chunks=0, backend="none", source=source, target=target)
    chunks = chunk_paragraphs(text, max_chars)
    if not chunks:
        return Translation(text=text, chunks=0, backend=translator.name, source=source, target=target)
    translated = translator.translate_chunks(list(chunks), source, target)
    if len(translated) != len(chunks):
        raise ValueError(
            f"{translator.name} returned {len(translated)} translations for {len(chunks)} chunks"
        )
    return Translation(
        text=chunks.join(translated),
        chunks=len(chunks),
        backend=translator.name,
        source=source,
        target=target,
    )
