"""The HITL body a reviewer sees: fetched title and text stay text when rendered as Markdown.

Rendered with markdown-it-py (CommonMark, HTML enabled as in a permissive renderer), an
independent Markdown implementation, not the code under test.
"""

from __future__ import annotations

from markdown_it import MarkdownIt

from onceflow.articles.chain import markdown_text, review_markdown

HOSTILE_TITLE = "[Approve here](https://evil.example/phish) <img src=x onerror=alert(1)> &amp; =1+2"
HOSTILE_TEXT = (
    "Intro ![](https://tracker.example/p.gif) and <script>alert(1)</script>\n\n"
    "# Not a heading\n\n- not a list\n\n**not bold** `not code` [ref]: https://evil.example\n\n"
    "1. not numbered\n\n> not a quote\n\n<a href='javascript:alert(1)'>click</a>"
)


def _render(source: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).render(source)


def test_a_hostile_title_and_text_render_as_the_same_characters_with_no_markup() -> None:
    body = review_markdown(
        {"title": HOSTILE_TITLE, "text": HOSTILE_TEXT},
        0.41,
        ["untranslated sentence: <b>Hola</b> [x](http://evil.example)"],
        "https://news.example.com/a?b=1&c=2",
        0.7,
    )
    rendered = _render(body)
    # the only link is the source's autolink; no image, script, raw tag, heading, list of the page
    assert rendered.count("<a ") == 1 and 'href="https://news.example.com/a?b=1&amp;c=2"' in rendered
    for markup in (
        "<img",
        "<script",
        'onerror="',
        "javascript:alert(1)'>",
        "<h1",
        "<ol",
        "<blockquote",
        "<code",
        "<strong>not",
    ):
        assert markup not in rendered, (markup, rendered)
    # and the reviewer still reads the page's characters, escaped for HTML
    assert (
        "[Approve here](https://evil.example/phish) &lt;img src=x onerror=alert(1)&gt; &amp;amp; =1+2"
        in rendered
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered and "# Not a heading" in rendered
    assert "**Score 0.41** (threshold 0.70)" in body


def test_every_ascii_punctuation_character_round_trips_as_itself() -> None:
    punctuation = "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
    rendered = _render(markdown_text(punctuation))
    assert (
        rendered
        == "<p>"
        + punctuation.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        + "</p>\n"
    )


def test_a_source_url_that_could_close_the_autolink_is_shown_as_text() -> None:
    body = review_markdown(
        {"title": "t", "text": "x"}, 0.5, [], "https://a.example/x>[y](http://evil.example)", 0.7
    )
    assert "evil.example" in _render(body) and 'href="http://evil.example"' not in _render(body)
