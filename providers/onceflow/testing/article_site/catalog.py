"""What the demo article site serves: each shipped file, its URL path and its ``Content-Type``.

The files live next to this module (package data). Some are wrong on purpose, for the fetch
step's bad-input tests; :attr:`Entry.note` says how.
"""

from __future__ import annotations

from dataclasses import dataclass

HTML_UTF8 = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Entry:
    """A shipped file.

    :ivar file: path inside the ``onceflow.testing.article_site`` package.
    :ivar content_type: the ``Content-Type`` header the site sends (maybe wrong on purpose).
    :ivar language: ISO 639-1 code of the text, for articles.
    :ivar note: what is special about it, if anything.
    """

    file: str
    content_type: str
    title: str = ""
    language: str = ""
    note: str = ""


ARTICLES: dict[str, Entry] = {
    "/articles/huertos-urbanos.html": Entry(
        "pages/huertos-urbanos.html", HTML_UTF8, "Los huertos urbanos de Valdeluna", "es", "image, list"
    ),
    "/articles/tren-nocturno.html": Entry(
        "pages/tren-nocturno.html", HTML_UTF8, "Vuelve el tren nocturno a la costa", "es", "table, SVG map"
    ),
    "/articles/historia-del-cafe.html": Entry(
        "pages/historia-del-cafe.html",
        HTML_UTF8,
        "Una historia del café en España",
        "es",
        "long (over 8,000 characters of text): needs chunking",
    ),
    "/articles/biblioteca-movil.html": Entry(
        "pages/biblioteca-movil.html", HTML_UTF8, "El bibliobús que recorre la sierra", "es", "image"
    ),
    "/articles/gazpacho.html": Entry(
        "pages/gazpacho.html",
        HTML_UTF8,
        "Gazpacho de la abuela Remedios",
        "es",
        "ordered and unordered lists",
    ),
    "/articles/cooperativa-solar.html": Entry(
        "pages/cooperativa-solar.html",
        HTML_UTF8,
        "Una cooperativa solar en el tejado del mercado",
        "es",
        "table",
    ),
    "/articles/festa-major.html": Entry(
        "pages/festa-major.html", HTML_UTF8, "La festa major de Sant Pere de Riudebitlles", "ca", "Catalan"
    ),
    "/articles/mercado-do-bolhao.html": Entry(
        "pages/mercado-do-bolhao.html", HTML_UTF8, "O Mercado do Bolhão reabre as portas", "pt", "Portuguese"
    ),
    "/articles/pagina-rota.html": Entry(
        "pages/pagina-rota.html", HTML_UTF8, "Página rota", "es", "truncated, malformed HTML"
    ),
    "/articles/con-script.html": Entry(
        "pages/con-script.html",
        HTML_UTF8,
        "Concurso de fotografía",
        "es",
        "<script>, onerror= and a javascript: link, for the sanitizer",
    ),
    "/articles/titulo-formula.html": Entry(
        "pages/titulo-formula.html", HTML_UTF8, "=HYPERLINK(...)", "es", "title starts with '=': a formula"
    ),
    "/articles/codificacion-erronea.html": Entry(
        "pages/codificacion-erronea.html",
        HTML_UTF8,
        "Año nuevo en la montaña",
        "es",
        "latin-1 bytes declared UTF-8 (header and <meta>)",
    ),
    "/articles/declarado-latin1.html": Entry(
        "pages/declarado-latin1.html",
        "text/html; charset=iso-8859-1",
        "¿Qué pasó con el puente?",
        "es",
        "UTF-8 bytes declared ISO-8859-1 in the header",
    ),
}

FILES: dict[str, Entry] = {
    "/static/huerto.png": Entry("static/huerto.png", "image/png"),
    "/static/bibliobus.png": Entry("static/bibliobus.png", "image/png"),
    "/static/taza.png": Entry("static/taza.png", "image/png"),
    "/static/mapa-tren.svg": Entry("static/mapa-tren.svg", "image/svg+xml"),
    "/static/sol.svg": Entry("static/sol.svg", "image/svg+xml"),
    "/notes.pdf": Entry("files/notes.pdf", "application/pdf", "Notas de la redacción", note="not HTML"),
    "/data/precios.csv": Entry("files/precios.csv", "text/csv; charset=utf-8", "Precios", note="not HTML"),
}
