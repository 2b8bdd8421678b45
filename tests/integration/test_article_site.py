"""The embedded demo article site: its shipped pages, ``/published/`` (and nothing outside it), the
command line, and ``FetchHook`` reading the ``onceflow_fetch`` connection to fetch from it."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest

from onceflow.articles.errors import PermanentStepError
from onceflow.hooks.fetch import FetchHook
from onceflow.testing.article_site import ARTICLES, FILES, ArticleSite, serve


class _Text(HTMLParser):
    """Visible text and image sources of a page, the way a reader sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []
        self.images: list[str] = []
        self.tags: set[str] = set()
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag in ("script", "style", "title"):
            self._skip += 1
        if tag == "img":
            self.images.extend(v for k, v in attrs if k == "src" and v)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.chunks.append(data)

    @property
    def text(self) -> str:
        return re.sub(r"\s+", " ", "".join(self.chunks)).strip()


def _get(site: ArticleSite, raw_path: str) -> tuple[int, str, bytes]:
    """GET a raw, unnormalised path (``..`` and all) straight over http.client."""
    conn = http.client.HTTPConnection(site.host, site.port, timeout=10)
    try:
        conn.request("GET", raw_path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def _parse(body: bytes, encoding: str) -> _Text:
    parser = _Text()
    parser.feed(body.decode(encoding))
    return parser


def test_the_site_serves_real_articles_with_images_tables_and_lists() -> None:
    languages = [entry.language for entry in ARTICLES.values()]
    assert languages.count("es") >= 6 and {"ca", "pt"} <= set(languages)
    lengths: dict[str, int] = {}
    with serve() as site:
        for path, entry in ARTICLES.items():
            status, content_type, body = _get(site, path)
            assert (status, content_type) == (200, entry.content_type), path
            assert body == resources.files("onceflow.testing.article_site").joinpath(entry.file).read_bytes()
            if path == "/articles/codificacion-erronea.html":
                continue  # latin-1 bytes on purpose: the fetch tests read it
            page = _parse(body, "utf-8")
            lengths[path] = len(page.text)
            for image in page.images:
                if image != "/static/no-existe.png":  # the broken image of the onerror= page
                    image_status, image_type, data = _get(site, image)
                    assert image_status == 200 and image_type.startswith("image/"), image
                    assert data.startswith(b"\x89PNG\r\n\x1a\n") or data.lstrip().startswith(b"<svg")
        tags = set().union(*(_parse(_get(site, p)[2], "utf-8").tags for p in ARTICLES if "erronea" not in p))
    assert {"table", "ul", "ol", "img", "h2"} <= tags
    assert lengths["/articles/historia-del-cafe.html"] > 8000  # long enough to be translated in chunks
    spanish = [
        p
        for p, e in ARTICLES.items()
        if e.language == "es" and not e.note.startswith(("<script", "title", "trunc"))
    ]
    assert sum(lengths.get(p, 0) > 1500 for p in spanish) >= 6  # several paragraphs each


def test_the_bad_pages_are_what_their_notes_say() -> None:
    with serve() as site:
        broken = _get(site, "/articles/pagina-rota.html")[2]
        assert not broken.rstrip().endswith(b"</html>") and b"</body>" not in broken
        scripted = _get(site, "/articles/con-script.html")[2]
        assert b"<script" in scripted and b"onerror=" in scripted and b'href="javascript:' in scripted
        formula = _get(site, "/articles/titulo-formula.html")[2].decode("utf-8")
        assert re.search(r"<title>=", formula)
        latin1 = _get(site, "/articles/codificacion-erronea.html")
        assert "charset=utf-8" in latin1[1] and "Año nuevo".encode("latin-1") in latin1[2]
        with pytest.raises(UnicodeDecodeError):
            latin1[2].decode("utf-8")
        status, content_type, pdf = _get(site, "/notes.pdf")
        assert (status, content_type) == (200, "application/pdf") and pdf.startswith(b"%PDF-1.4")
        assert _get(site, "/data/precios.csv")[1].startswith("text/csv")
        assert _get(site, "/status/410")[0] == 410
        assert _get(site, "/articles/no-such-article.html")[0] == 404
    assert set(FILES) >= {"/notes.pdf", "/data/precios.csv"}


def test_published_pages_are_served_and_nothing_outside_their_directory(tmp_path: Path) -> None:
    published = tmp_path / "published"
    (published / "es" / "art-1").mkdir(parents=True)
    (published / "es" / "art-1" / "index.html").write_text("<h1>Publicado</h1>", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("do not serve", encoding="utf-8")
    (published / "link-out").symlink_to(tmp_path / "secret.txt")
    with serve(published_dir=published) as site:
        assert _get(site, "/published/es/art-1/index.html")[:2] == (200, "text/html; charset=utf-8")
        assert _get(site, "/published/es/art-1/")[2] == b"<h1>Publicado</h1>"
        assert b"es/" in _get(site, "/published/")[2]  # a listing of the directory
        for attack in (
            "/published/../secret.txt",
            "/published/%2e%2e/secret.txt",
            "/published/es/../../secret.txt",
            "/published/link-out",
            f"/published/{tmp_path}/secret.txt",
            "/published/..%2fsecret.txt",
        ):
            status, _type, body = _get(site, attack)
            assert status == 404 and b"do not serve" not in body, attack
    with serve() as without:
        assert _get(without, "/published/es/art-1/index.html")[0] == 404


def test_the_command_line_serves_until_sigterm(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceflow.testing.article_site",
            "--port",
            "0",
            "--published-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.fullmatch(r"article site: http://127\.0\.0\.1:(\d+)/\n", line)
        assert match, line
        conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=10)
        conn.request("GET", "/")
        index = conn.getresponse().read().decode("utf-8")
        conn.close()
        assert "Gazpacho de la abuela Remedios" in index and "/published/" in index
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: dict[str, object]) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", "extra": extra})
    )


def test_the_fetch_hook_takes_its_allow_list_from_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    with serve() as site:
        url = site.url("/articles/festa-major.html")
        _connection(monkeypatch, "fetch_demo_t", {"allow": [site.address], "max_bytes": 100_000})
        page = FetchHook("fetch_demo_t").fetch(url)
        assert "La festa major" in page.text and page.status == 200
        with pytest.raises(PermanentStepError) as caught:
            FetchHook("fetch_not_defined_t").fetch(url)  # no connection: the defaults, nothing private
        assert caught.value.reason == "blocked: 127.0.0.1 (loopback) for host 127.0.0.1"
        _connection(monkeypatch, "fetch_small_t", {"allow": [site.address], "max_bytes": 1000})
        with pytest.raises(PermanentStepError, match="too large: Content-Length"):
            FetchHook("fetch_small_t").fetch(url)
    assert [a.path for a in site.log] == ["/articles/festa-major.html", "/articles/festa-major.html"]


def test_the_article_site_fixture_serves_published_pages_and_allows_the_default_hook(
    article_site: ArticleSite,
) -> None:
    assert article_site.published_dir is not None
    (article_site.published_dir / "hola.html").write_text("<!doctype html><p>¡Hola!</p>", encoding="utf-8")
    page = FetchHook().fetch(article_site.url("/published/hola.html"))
    assert page.text == "<!doctype html><p>¡Hola!</p>"


def test_the_fetch_hook_names_bad_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(monkeypatch, "fetch_bad_t", {"allow": "127.0.0.1:notaport", "timeout": 5})
    with pytest.raises(ValueError) as caught:
        _ = FetchHook("fetch_bad_t").policy
    message = str(caught.value)
    assert message.startswith("connection 'fetch_bad_t': bad onceflow_fetch extras:")
    assert "unknown key 'timeout'" in message and "bad port 'notaport'" in message


def test_the_published_root_lists_pages_by_title_newest_first(tmp_path: Path) -> None:
    import os

    published = tmp_path / "published"
    (published / "es" / "a").mkdir(parents=True)
    (published / "es" / "b").mkdir(parents=True)
    (published / "es" / "a" / "index.html").write_text(
        "<title>Biblioteca m&oacute;vil</title>", encoding="utf-8"
    )
    (published / "es" / "b" / "index.html").write_text(
        "<title><script>x</script>Huertos</title>", encoding="utf-8"
    )
    os.utime(published / "es" / "a" / "index.html", (1, 1))
    with serve(published_dir=published) as site:
        status, kind, body = _get(site, "/published/")
    page = body.decode()
    assert status == 200 and kind.startswith("text/html")
    assert page.index("Huertos") < page.index("Biblioteca móvil")  # newest first
    assert '<a href="/published/es/a/index.html">Biblioteca móvil</a>' in page
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_dashboard_folder_is_served_under_dashboard(tmp_path: Path) -> None:
    dashboard = tmp_path / "dashboard"
    dashboard.mkdir()
    (dashboard / "index.html").write_text("<h1>Sales</h1>", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("no")
    with serve(dashboard_dir=dashboard) as site:
        assert _get(site, "/dashboard/")[2] == b"<h1>Sales</h1>"
        assert _get(site, "/dashboard/../secret.txt")[0] == 404
    with serve() as site:
        assert _get(site, "/dashboard/")[0] == 404  # no folder given: nothing served
