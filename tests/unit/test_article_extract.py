"""Extract: trafilatura's main text as paragraphs, the title, and the language (lingua over ``<html lang>``)."""

from __future__ import annotations

import pytest

from onceflow.articles.errors import PermanentStepError
from onceflow.articles.extract import MIN_WORDS, extract_article

ARTICLE = """<!doctype html>
<html lang="{lang}"><head><meta charset="utf-8"><title>El puerto recupera los ferris nocturnos | Diario del Sur</title></head>
<body>
<header><nav><a href="/">Portada</a> <a href="/deportes">Deportes</a> <a href="/cultura">Cultura</a></nav></header>
<main><article>
<h1>El puerto recupera los ferris nocturnos</h1>
<p>La autoridad portuaria anunció ayer que los ferris nocturnos entre la isla y el continente volverán a
funcionar a partir del mes de marzo, después de dos años de interrupción por obras en el muelle.</p>
<p>Los pescadores y los comerciantes del mercado llevaban meses reclamando el servicio. "Sin el barco de la
noche, el pescado llega tarde a la capital", explicó una vendedora.</p>
<ul><li>Salida de la isla: once de la noche</li><li>Llegada al continente: una de la madrugada</li></ul>
<table><tr><th>Día</th><th>Barcos</th></tr><tr><td>Lunes</td><td>Dos</td></tr><tr><td>Sábado</td><td>Cuatro</td></tr></table>
<p>El precio del billete no cambiará este año, según confirmó la empresa concesionaria del servicio.</p>
</article></main>
<footer><p>Todos los derechos reservados. Aviso legal. Política de cookies.</p></footer>
</body></html>
"""

ENGLISH_DECLARED_SPANISH = """<html lang="es"><head><title>Harbour news</title></head><body><article>
<h1>The harbour brings back the night ferries</h1>
<p>The port authority announced yesterday that the night ferries between the island and the mainland will
run again from March, after two years of interruption caused by works on the pier.</p>
<p>Fishermen and market traders had been asking for the service for months. Without the night boat, the fish
reaches the capital late, one trader explained to this newspaper.</p>
</article></body></html>
"""


def test_it_extracts_title_paragraphs_list_and_table_without_boilerplate():
    extracted = extract_article(ARTICLE.format(lang="es"), "http://127.0.0.1:8000/puerto.html")

    assert extracted.title == "El puerto recupera los ferris nocturnos"
    assert extracted.language == "es"
    assert extracted.paragraphs[0].startswith("La autoridad portuaria anunció ayer")
    # the list is one paragraph of "- " items, the table one paragraph of "cell | cell" rows
    assert (
        "- Salida de la isla: once de la noche\n- Llegada al continente: una de la madrugada"
        in extracted.paragraphs
    )
    assert "Día | Barcos\nLunes | Dos\nSábado | Cuatro" in extracted.paragraphs
    assert extracted.paragraphs[-1].startswith("El precio del billete no cambiará")
    assert extracted.text == "\n\n".join(extracted.paragraphs)
    for boilerplate in ("Portada", "Deportes", "derechos reservados", "cookies"):
        assert boilerplate not in extracted.text
    # the title is not repeated as the first paragraph; no paragraph holds a blank line
    assert extracted.title not in extracted.paragraphs
    assert all("\n\n" not in p and p == p.strip() for p in extracted.paragraphs)


def test_a_confident_detection_beats_a_wrong_html_lang():
    extracted = extract_article(ENGLISH_DECLARED_SPANISH, "http://127.0.0.1:8000/harbour.html")

    assert extracted.language == "en"


def test_the_declared_language_is_kept_when_the_text_agrees():
    extracted = extract_article(ARTICLE.format(lang="es-ES"), "http://127.0.0.1:8000/puerto.html")

    assert extracted.language == "es"


def test_it_is_deterministic():
    html = ARTICLE.format(lang="es")

    first = extract_article(html, "http://127.0.0.1:8000/a.html")
    again = [extract_article(html, "http://127.0.0.1:8000/a.html") for _ in range(3)]

    assert all(other == first for other in again)


@pytest.mark.parametrize(
    "html",
    [
        "",
        "<html><body></body></html>",
        "<html lang='es'><head><title>Acceso</title></head><body><form><input name=u><button>Entrar</button></form></body></html>",
        "<html><body><p>Página no encontrada.</p></body></html>",
    ],
    ids=["empty", "empty-body", "login-form", "one-line"],
)
def test_a_page_without_article_text_is_a_permanent_failure_with_a_reason(html):
    with pytest.raises(PermanentStepError) as failure:
        extract_article(html, "http://127.0.0.1:8000/nada.html")

    assert failure.value.step == "extract"
    assert failure.value.reason.startswith(
        "extract: no article text found at http://127.0.0.1:8000/nada.html"
    )
    assert f"at least {MIN_WORDS} needed" in failure.value.reason


FRENCH_UNDECLARED = """<html><head><title>Le port</title></head><body><div class="content">
<h2>Le port retrouve ses ferries de nuit</h2>
<p>L'autorité portuaire a annoncé hier que les ferries de nuit entre l'île et le continent reprendront
à partir du mois de mars, après deux ans d'interruption à cause des travaux sur le quai.</p>
<p>Les pêcheurs et les commerçants du marché réclamaient le service depuis des mois. Sans le bateau
de nuit, le poisson arrive en retard dans la capitale, <b>a expliqué</b> une vendeuse.<br>Le prix ne
changera pas.</p>
</div></body></html>
"""


def test_an_undeclared_language_is_detected_and_inline_markup_is_flattened():
    extracted = extract_article(FRENCH_UNDECLARED, "http://127.0.0.1:8000/port.html")

    assert extracted.language == "fr"
    assert extracted.paragraphs[-1].startswith("Les pêcheurs et les commerçants")
    assert "une vendeuse. Le prix ne changera pas." in extracted.paragraphs[-1]  # <br> and <b> flattened


@pytest.mark.parametrize("reference", ["&#11;", "&#xB;", "&#11", "&#8;", "&#xFFFF;", "&#65534;", "&#x1;"])
def test_a_reference_to_a_character_xml_cannot_hold_does_not_lose_the_article(reference):
    # Word's line break comes out of CMS exports as "&#11;": trafilatura's XML tree refused the
    # whole document for it, and the article failed as "no article text found"
    html = ARTICLE.format(lang="es").replace("después de dos años", f"después{reference}de dos años")

    extracted = extract_article(html, "http://127.0.0.1:8000/puerto.html")

    assert extracted.title == "El puerto recupera los ferris nocturnos"
    assert "después de dos años de interrupción" in extracted.text
    assert extracted.paragraphs[-1].startswith("El precio del billete no cambiará")


def test_references_xml_can_hold_are_left_to_the_parser():
    html = ARTICLE.format(lang="es").replace("una vendedora", "una vendedora&#8212;&#x1F600;&#146;&#9;x")

    extracted = extract_article(html, "http://127.0.0.1:8000/puerto.html")

    assert "una vendedora\u2014\U0001f600\u2019 x" in extracted.text
