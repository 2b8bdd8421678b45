"""The published page: what nh3 lets through from a fetched article, and the document around it.

Assertions are made on the HTML nh3 returns, parsed again with the standard library's parser (an
independent reader), so a check cannot pass because of how a string happens to be spelled.
"""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from onceflow.articles.publish import render_page, sanitize


class _Collect(HTMLParser):
    """Every start tag with its attributes, and the text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(html: str) -> _Collect:
    collector = _Collect()
    collector.feed(html)
    collector.close()
    return collector


def url_attributes(html: str) -> list[str]:
    return [v or "" for _, attrs in parsed(html).tags for k, v in attrs.items() if k in ("href", "src")]


def assert_no_active_content(html: str) -> None:
    p = parsed(html)
    tags = {t for t, _ in p.tags}
    assert not tags & {"script", "style", "svg", "math", "iframe", "object", "embed", "form", "base"}, tags
    for tag, attrs in p.tags:
        assert not [k for k in attrs if k.startswith("on")], (tag, attrs)
        assert "style" not in attrs and "srcset" not in attrs, (tag, attrs)
    for url in url_attributes(html):
        assert url.startswith(("http://", "https://")), url


def test_scripts_and_styles_go_with_their_content() -> None:
    out = sanitize("<p>Hola</p><script>alert('x')</script><style>p{color:red}</style><p>mundo</p>")
    assert_no_active_content(out)
    assert "".join(parsed(out).text) == "Holamundo", "the code inside is not kept as article text"


@pytest.mark.parametrize(
    "attack",
    [
        '<img src="https://img.example/a.png" onerror="alert(1)">',
        '<p onclick="alert(1)" onmouseover=alert(2)>texto</p>',
        '<a href="https://ok.example/" onfocus="alert(1)" autofocus>x</a>',
        '<body onload="alert(1)"><p>x</p></body>',
    ],
)
def test_event_handlers_are_removed(attack: str) -> None:
    assert_no_active_content(sanitize(attack))


@pytest.mark.parametrize(
    "href",
    [
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        " javascript:alert(1)",
        "jav&#x09;ascript:alert(1)",
        "jav&#x0A;ascript:alert(1)",
        "&#106;&#97;&#118;&#97;&#115;&#99;&#114;&#105;&#112;&#116;:alert(1)",
        "&#x6A;avascript&#x3A;alert(1)",
        "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
        "vbscript:msgbox(1)",
        "/relative/path",
    ],
)
def test_links_keep_only_http_urls(href: str) -> None:
    out = sanitize(f'<a href="{href}">enlace</a>')
    assert_no_active_content(out)
    assert url_attributes(out) == []
    assert "enlace" in "".join(parsed(out).text), "the link text stays"


@pytest.mark.parametrize(
    "src",
    ["javascript:alert(1)", "jav&#x09;ascript:alert(1)", "data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=", "x"],
)
def test_images_keep_only_http_sources(src: str) -> None:
    out = sanitize(f'<img src="{src}" alt="foto">')
    assert_no_active_content(out)
    assert url_attributes(out) == []


@pytest.mark.parametrize(
    "attack",
    [
        "<svg onload=alert(1)><circle r=10></circle></svg>",
        '<svg><a xlink:href="javascript:alert(1)"><text x="0" y="20">clic</text></a></svg>',
        "<svg><script>alert(1)</script></svg>",
        '<svg><animate attributeName="href" to="javascript:alert(1)"/></svg>',
        '<math><mtext><a href="javascript:alert(1)">x</a></mtext></math>',
        "<svg><style><img src=x onerror=alert(1)></style></svg>",
        '<iframe src="https://evil.example/"></iframe><object data="x.swf"></object>',
        '<form action="https://evil.example/"><input name="q"></form>',
        '<base href="https://evil.example/">',
        '<img src="https://img.example/a.png" srcset="javascript:alert(1) 2x" style="background:url(javascript:x)">',
    ],
)
def test_svg_math_frames_and_forms_do_not_survive(attack: str) -> None:
    assert_no_active_content(sanitize(attack))


def test_article_structure_survives_with_safe_links() -> None:
    article = (
        "<h2>Título</h2><p>Un <strong>texto</strong> con <em>énfasis</em>.</p>"
        "<figure><img src='https://img.example/a.png' alt='foto' width='640' height='100%;background:url(x)'><figcaption>Pie</figcaption></figure>"
        "<table><tr><th>Año</th><td colspan='2'>2026</td></tr></table>"
        "<ul><li>uno</li></ul><blockquote>cita</blockquote>"
        "<a href='https://fuente.example/nota'>fuente</a>"
    )
    p = parsed(sanitize(article))
    tags = [t for t, _ in p.tags]
    for kept in (
        "h2",
        "p",
        "strong",
        "em",
        "figure",
        "img",
        "figcaption",
        "table",
        "th",
        "td",
        "ul",
        "li",
        "blockquote",
        "a",
    ):
        assert kept in tags, kept
    attrs = dict(p.tags)
    # sizes are numbers or nothing
    assert attrs["img"] == {"src": "https://img.example/a.png", "alt": "foto", "width": "640"}
    assert attrs["td"] == {"colspan": "2"}
    assert attrs["a"] == {"href": "https://fuente.example/nota", "rel": "noopener noreferrer nofollow"}


def test_render_page_is_deterministic_escapes_the_title_and_sanitizes_the_body() -> None:
    args = dict(
        title='=HYPERLINK("https://evil.example","<b>clic</b>")',
        body_html="<p>Hello</p><script>alert(1)</script><a href='javascript:x'>y</a>",
        source_url="https://news.example.es/articulo?id=1&x=2",
        attribution="Translated by Apertium (spa-eng)",
        score=0.8734,
        lang="en",
    )
    page = render_page(**args)  # type: ignore[arg-type]
    assert page == render_page(**args), "same inputs, same bytes"  # type: ignore[arg-type]
    html = page.decode("utf-8")
    assert_no_active_content(html.split("<body>", 1)[1])
    p = parsed(html)
    assert '=HYPERLINK("https://evil.example","<b>clic</b>")' in p.text, "the title is text"
    assert "b" not in [t for t, _ in p.tags]
    assert (
        "a",
        {"href": "https://news.example.es/articulo?id=1&x=2", "rel": "noopener noreferrer nofollow"},
    ) in p.tags
    assert "0.87" in html and 'lang="en"' in html
    assert render_page(**{**args, "score": 0.5}) != page  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("source_url", "javascript:alert(1)", "source_url must be an http"),
        ("source_url", "file:///etc/passwd", "source_url must be an http"),
        ("lang", 'en" onload="x', "lang must be a language tag"),
        ("lang", "", "lang must be a language tag"),
    ],
)
def test_render_page_refuses_bad_inputs(field: str, value: str, message: str) -> None:
    args = dict(
        title="t",
        body_html="<p>b</p>",
        source_url="https://a.example/",
        attribution="a",
        score=1.0,
        lang="es",
    )
    with pytest.raises(ValueError, match=message):
        render_page(**{**args, field: value})  # type: ignore[arg-type]
