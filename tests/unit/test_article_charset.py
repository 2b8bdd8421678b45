"""Decoding a fetched page: declared, sniffed, and wrongly declared encodings all give the right text."""

from __future__ import annotations

import codecs

import pytest

from onceflow.articles.charset import decode_html

TEXT = (
    "<!doctype html><html><head><title>¿Qué pasó en Peñaflor?</title></head><body>"
    "<p>Año nuevo en la montaña: Íñigo Ibáñez subió al refugio del Águila. ¡Feliz año!</p>" * 5
)
SPANISH = ("¿Qué pasó en Peñaflor?", "Año nuevo en la montaña", "Íñigo Ibáñez", "¡Feliz año!")


def _is_right(text: str) -> bool:
    return all(word in text for word in SPANISH)


def test_a_correct_declaration_is_used() -> None:
    decoded = decode_html(TEXT.encode("utf-8"), "utf-8")
    assert (decoded.charset, decoded.source) == ("utf-8", "header")
    assert _is_right(decoded.text)


def test_latin1_bytes_declared_utf8_are_decoded_right() -> None:
    decoded = decode_html(TEXT.encode("latin-1"), "utf-8")
    assert decoded.source in ("detected", "fallback")
    assert decoded.charset in ("cp1252", "iso8859-1", "latin-1")
    assert _is_right(decoded.text)
    assert "\ufffd" not in decoded.text


def test_utf8_bytes_declared_latin1_are_decoded_right() -> None:
    decoded = decode_html(TEXT.encode("utf-8"), "iso-8859-1")
    assert (decoded.charset, decoded.source) == ("utf-8", "utf-8")
    assert _is_right(decoded.text)
    assert "Ã" not in decoded.text


def test_a_meta_declaration_is_used_when_the_header_has_none() -> None:
    body = b'<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1">' + TEXT.encode(
        "latin-1"
    )
    decoded = decode_html(body, None)
    assert (decoded.charset, decoded.source, decoded.meta_charset) == ("cp1252", "meta", "iso-8859-1")
    assert _is_right(decoded.text)


def test_latin1_labels_mean_windows_1252_as_in_browsers() -> None:
    body = "“comillas” y el euro: 5 €".encode("cp1252")
    assert decode_html(body, "iso-8859-1").text == "“comillas” y el euro: 5 €"


def test_no_declaration_sniffs_utf8_then_detects() -> None:
    assert decode_html(TEXT.encode("utf-8"), None).source == "utf-8"
    assert _is_right(decode_html(TEXT.encode("latin-1"), None).text)


def test_a_byte_order_mark_wins_and_an_unknown_label_is_skipped() -> None:
    decoded = decode_html(codecs.BOM_UTF8 + TEXT.encode("utf-8"), "iso-8859-1")
    assert (decoded.charset, decoded.source) == ("utf-8", "bom")
    assert _is_right(decode_html(TEXT.encode("utf-8"), "no-such-charset").text)


@pytest.mark.parametrize(
    "label", ["zlib", "base64", "rot13", "hex", "bz2", "uu", "quopri", "undefined", "unicode_escape"]
)
@pytest.mark.parametrize("body_end", [b"Espana \\u003cb\\u003e", b"Espa\xf1a"])  # ASCII, latin-1
def test_a_codec_that_is_no_charset_is_ignored_like_an_unknown_label(label: str, body_end: bytes) -> None:
    # the label is the page's: bytes.decode("zlib") raised LookupError, "undefined" UnicodeError
    # (an unexpected exception instead of a page), and unicode_escape read "\\u003c" as "<"
    body = f"<html><head><meta charset={label}></head><body><p>".encode() + body_end

    for decoded in (decode_html(body, None), decode_html(body, label)):
        assert decoded.charset != codecs.lookup(label).name
        assert decoded.source in ("utf-8", "detected", "fallback")
        assert "<p>Espa" in decoded.text  # decoded, whatever the detector makes of one latin-1 byte
        assert "<b>" not in decoded.text
