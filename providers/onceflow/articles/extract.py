"""Extract: title, main text and language of a fetched page, with trafilatura and lingua.

trafilatura finds the main content (boilerplate, navigation and footers dropped) and gives it as
an XML tree, which keeps the structure: each heading and paragraph becomes one paragraph of
:attr:`Extracted.text`, a list becomes one paragraph of ``- item`` lines, a table one paragraph of
``cell | cell`` lines. Paragraphs are separated by one blank line and never contain one, so the
translate step can chunk on paragraph boundaries.

Language: lingua's detection on the extracted text wins when it is confident
(:data:`CONFIDENT`), because a page's declared language is often a site template's default; else
the declared ``<html lang>`` (or trafilatura's metadata); else lingua's best guess, if any.

Same input, same output: trafilatura's deduplication cache (which makes a second call differ) is
off, and lingua is deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from onceflow.articles import language as lang
from onceflow.articles.errors import PermanentStepError

#: fewer words than this in the main text is "no article" (a login wall, an index page, an error).
MIN_WORDS = 20
#: lingua confidence from which the detected language beats the declared one.
CONFIDENT = 0.6

_HTML_LANG = re.compile(r"<html\b[^>]*?\blang\s*=\s*[\"']?([A-Za-z]{2,3}(?:[-_][A-Za-z0-9]+)*)", re.I)
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Extracted:
    """What the extract step stores for the translate step.

    :param title: the article's title ("" when the page has none).
    :param text: the paragraphs joined by blank lines.
    :param language: ISO 639-1 code, or ``None`` when neither the page nor lingua can tell.
    :param paragraphs: the paragraphs, in page order.
    """

    title: str
    text: str
    language: str | None
    paragraphs: list[str] = field(default_factory=list)


def _flat(element: Any) -> str:
    for line_break in element.iter("lb"):  # <br>: a space, not two words glued together
        line_break.text = " "
    return _SPACES.sub(" ", "".join(element.itertext())).strip()


def _paragraphs(main: Any) -> list[str]:
    out: list[str] = []
    for child in main:
        tag = child.tag
        if tag == "list":
            items = [_flat(item) for item in child.iter("item")]
            text = "\n".join(f"- {item}" for item in items if item)
        elif tag == "table":
            rows = []
            for row in child.iter("row"):
                cells = [_flat(cell) for cell in row.iter("cell")]
                if any(cells):
                    rows.append(" | ".join(cells))
            text = "\n".join(rows)
        elif tag == "graphic":
            continue
        else:  # head, p, quote, code, ...
            text = _flat(child)
        if text:
            out.append(text)
    return out


# a numeric character reference to a code point XML cannot hold (C0 controls but tab, newline and
# CR; U+FFFE, U+FFFF): lxml's HTML parser keeps it, and trafilatura's XML output tree then refuses
# the whole document, so one "&#11;" (Word's line break, common in CMS exports) lost the article
_XML_INVALID_REF = re.compile(r"&#(?:[xX]0*([0-9A-Fa-f]{1,6})|0*([0-9]{1,7}));?")
_XML_INVALID = frozenset([*range(0x0, 0x9), 0xB, 0xC, *range(0xE, 0x20), 0xFFFE, 0xFFFF])


def _xml_safe_references(html: str) -> str:
    """``html`` with references to code points XML cannot hold replaced by a space."""

    def fix(match: re.Match[str]) -> str:
        code = int(match.group(1), 16) if match.group(1) else int(match.group(2))
        return " " if code in _XML_INVALID else match.group(0)

    return _XML_INVALID_REF.sub(fix, html)


def declared_language(html: str, metadata_language: str | None = None) -> str | None:
    """The page's declared language: ``<html lang>``, else trafilatura's metadata."""
    match = _HTML_LANG.search(html[:20_000])
    return lang.normalize_code(match.group(1) if match else None) or lang.normalize_code(metadata_language)


def choose_language(declared: str | None, detected: str | None, confidence: float) -> str | None:
    """See the module docstring: a confident detection, else the declaration, else the guess."""
    if detected and confidence >= CONFIDENT:
        return detected
    return declared or detected


def extract_article(html: str, url: str) -> Extracted:
    """Title, main text (paragraphs separated by blank lines) and language of ``html``.

    :param html: the decoded page.
    :param url: where it came from (trafilatura uses it for metadata and relative links).
    :raises PermanentStepError: when the page has no article text (fewer than :data:`MIN_WORDS` words).
    """
    import trafilatura

    document = trafilatura.bare_extraction(
        _xml_safe_references(html),
        url=url,
        with_metadata=True,
        include_tables=True,
        include_comments=False,
        include_images=False,
        deduplicate=False,
    )
    body = getattr(document, "body", None)
    paragraphs = _paragraphs(body) if body is not None else []
    title = _SPACES.sub(" ", str(getattr(document, "title", None) or "")).strip()
    if not title and paragraphs:
        title = paragraphs[0]
    if paragraphs and paragraphs[0] == title:
        paragraphs = paragraphs[1:]  # the heading repeats the title
    words = sum(len(p.split()) for p in paragraphs)
    if words < MIN_WORDS:
        raise PermanentStepError(
            f"extract: no article text found at {url} ({words} words of main text, "
            f"at least {MIN_WORDS} needed)",
            step="extract",
        )
    text = "\n\n".join(paragraphs)
    declared = declared_language(html, getattr(document, "language", None))
    detected, confidence = lang.detect(text, declared)
    return Extracted(
        title=title,
        text=text,
        language=choose_language(declared, detected, confidence),
        paragraphs=paragraphs,
    )
