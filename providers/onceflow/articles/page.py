"""The published page: the fetched article's HTML sanitized, and the small document around it.

The body comes from a page on the internet (through a shared sheet), so it is cleaned with nh3
(the ammonia sanitizer) against an allow-list: article structure, tables, images and links
only, every URL attribute ``http``/``https`` (ammonia parses the URL the way a browser does, so
``jav&#x09;ascript:`` is ``javascript:`` and refused), and no script, style, SVG, MathML, frames
or event handlers. :func:`render_page` sanitizes the body itself, so nothing unsanitized can be
rendered, and it is deterministic (no timestamps, no random ids): the same inputs give the same
bytes, which is what lets a re-publish compare bytes and write nothing. See ``docs/articles.md``.
"""

from __future__ import annotations

import html
import re
from urllib.parse import urlsplit

#: elements an article may keep; anything else is unwrapped (its text kept)
ALLOWED_TAGS = frozenset(
    {
        "p", "br", "h1", "h2", "h3", "h4", "ul", "ol", "li",
        "table", "caption", "thead", "tbody", "tfoot", "tr", "th", "td",
        "img", "a", "em", "strong", "blockquote", "figure", "figcaption",
    }
)  # fmt: skip
#: attributes per element; URL attributes are checked against :data:`URL_SCHEMES`
ALLOWED_ATTRIBUTES: dict[str, set[str]] = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "th": {"colspan", "rowspan", "scope"},
    "td": {"colspan", "rowspan"},
}
#: elements removed together with their content (not unwrapped): their text is code, not article
DROPPED_WITH_CONTENT = frozenset(
    {
        "script", "style", "svg", "math", "iframe", "object", "embed", "template",
        "noscript", "frame", "frameset", "applet", "textarea", "select", "head", "title",
    }
)  # fmt: skip
URL_SCHEMES = frozenset({"http", "https"})
LINK_REL = "noopener noreferrer nofollow"
_NUMBER_RE = re.compile(r"^\d{1,5}$")
_LANG_RE = re.compile(r"^[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*$")


def _attribute_filter(element: str, attribute: str, value: str) -> str | None:
    # sizes are numbers or nothing ("100%;background:url(...)" is not a size)
    if attribute in ("width", "height", "colspan", "rowspan"):
        return value if _NUMBER_RE.match(value.strip()) else None
    return value


def sanitize(body_html: str) -> str:
    """The article HTML with everything outside the allow-list removed.

    Relative URLs are dropped (they would point into our own site, not the source's); links get
    ``rel="noopener noreferrer nofollow"``; comments go.

    :param body_html: an HTML fragment from the fetched page.
    """
    import nh3

    return nh3.clean(
        body_html,
        tags=set(ALLOWED_TAGS),
        clean_content_tags=set(DROPPED_WITH_CONTENT),
        attributes=ALLOWED_ATTRIBUTES,
        attribute_filter=_attribute_filter,
        strip_comments=True,
        link_rel=LINK_REL,
        url_schemes=set(URL_SCHEMES),
        url_relative="deny",
    )


def _http_url(url: str, what: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in URL_SCHEMES or not parts.netloc:
        raise ValueError(f"{what} must be an http(s) URL, got {url!r}")
    return url.strip()


_PAGE = """<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src http: https:; style-src 'unsafe-inline'">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<style>body{{max-width:42rem;margin:2rem auto;padding:0 1rem;font-family:sans-serif;line-height:1.5}}img{{max-width:100%}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.25rem}}footer{{margin-top:2rem;font-size:.9rem;color:#555}}</style>
</head>
<body>
<article>
<h1>{title}</h1>
{body}
</article>
<footer>
<p>Source: <a href="{source}" rel="{rel}">{source_text}</a></p>
<p>{attribution}</p>
<p>Translation score: {score}</p>
</footer>
</body>
</html>
"""


def render_page(
    title: str, body_html: str, source_url: str, attribution: str, score: float, lang: str
) -> bytes:
    """A complete HTML document (UTF-8), byte-identical for identical inputs.

    :param title: plain text (escaped here; ``=HYPERLINK(...)`` or ``<b>`` stay text).
    :param body_html: the translated article as HTML; sanitized here (:func:`sanitize`).
    :param source_url: the original article's URL (http or https).
    :param attribution: plain text, e.g. "Translated by Apertium from an article by ...".
    :param score: the translation score, shown with two decimals.
    :param lang: the page's language tag (``en``, ``es``, ``pt-BR``).
    :raises ValueError: a source URL that is not http(s), a language tag that is not one.
    """
    source = _http_url(source_url, "source_url")
    if not _LANG_RE.match(lang or ""):
        raise ValueError(f"lang must be a language tag such as 'en' or 'pt-BR', got {lang!r}")
    page = _PAGE.format(
        lang=html.escape(lang),
        title=html.escape(title.strip(), quote=True),
        body=sanitize(body_html).strip(),
        source=html.escape(source, quote=True),
        source_text=html.escape(source),
        rel=LINK_REL,
        attribution=html.escape(attribution.strip()),
        score=f"{float(score):.2f}",
    )
    return page.encode("utf-8")
