"""Turn a fetched page's bytes into text, whatever its declaration says.

Order: a byte-order mark; then the declarations (the ``Content-Type`` header, then ``<meta
charset>`` or ``http-equiv``), each used only if the bytes decode strictly with it; then sniffing
(strict UTF-8, then ``charset_normalizer`` when installed, then windows-1252).

A wrong declaration is common on old sites: UTF-8 bytes declared latin-1 and latin-1 bytes
declared UTF-8. The second fails strict decoding and falls through. The first would "succeed"
(every byte is a latin-1 character) and give mojibake (``EspaÃ±a``), so a single-byte
declaration loses to strict UTF-8 when the bytes are valid UTF-8 with non-ASCII in them: a
latin-1 text is practically never valid UTF-8 by accident.

Labels follow browsers (WHATWG): ``iso-8859-1``, ``latin1`` and ``us-ascii`` mean windows-1252.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

# how far into the document to look for <meta charset> (browsers prescan 1024 bytes)
META_PRESCAN = 4096

_META_CHARSET = re.compile(rb"""<meta[^>]*?\bcharset\s*=\s*["']?\s*([A-Za-z0-9._:\-]+)""", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_WINDOWS_1252_ALIASES = {"latin_1", "iso8859_1", "ascii", "cp1252"}
# text codecs of Python's that are no character set a page can be written in
_NOT_CHARSETS = frozenset({"undefined", "unicode_escape", "raw_unicode_escape", "idna", "punycode", "utf_7"})
_MULTI_BYTE = ("utf", "gb", "big5", "shift_jis", "cp932", "cp949", "cp950", "euc", "iso2022", "johab", "hz")


@dataclass(frozen=True)
class Decoded:
    """The text, the codec that produced it, and why that codec was chosen.

    :ivar source: ``bom``, ``header``, ``meta``, ``utf-8`` (strict UTF-8 won over a wrong or
        missing declaration), ``detected`` (charset_normalizer) or ``fallback``.
    """

    text: str
    charset: str
    source: str
    meta_charset: str | None


def meta_charset(body: bytes) -> str | None:
    """The charset a ``<meta>`` tag declares in the first :data:`META_PRESCAN` bytes."""
    match = _META_CHARSET.search(body[:META_PRESCAN])
    return match.group(1).decode("ascii").lower() if match else None


def _codec(label: str | None) -> str | None:
    """Python's codec for a charset label, browser-style; ``None`` if unknown or not a charset.

    The label comes from the page: Python also knows codecs that are no character set (``zlib``,
    ``base64``, ``rot13``: ``bytes.decode`` raises ``LookupError`` for them; ``undefined`` always
    fails; ``unicode_escape`` would read ``\\u003c`` as ``<``), and those are ignored like unknown
    labels.
    """
    if not label:
        return None
    try:
        info = codecs.lookup(label.strip().strip("\"'"))
    except LookupError:
        return None
    name = info.name
    if not getattr(info, "_is_text_encoding", True) or name.replace("-", "_") in _NOT_CHARSETS:
        return None
    normalized = name.replace("-", "_")
    return "cp1252" if normalized in _WINDOWS_1252_ALIASES else name


def _strict(body: bytes, codec: str) -> str | None:
    try:
        text = body.decode(codec)
    except UnicodeDecodeError:
        if codec != "cp1252":
            return None
        # five bytes are unassigned in windows-1252; browsers map them to C1 controls like latin-1
        return body.decode("latin-1")
    return text


def _is_single_byte(codec: str) -> bool:
    return not codec.replace("-", "_").startswith(_MULTI_BYTE)


def decode_html(body: bytes, declared: str | None) -> Decoded:
    """Decode ``body``; ``declared`` is the ``Content-Type`` header's charset, if any."""
    meta = meta_charset(body)
    for bom, bom_codec in _BOMS:
        if body.startswith(bom):
            return Decoded(body[len(bom) :].decode(bom_codec, errors="replace"), bom_codec, "bom", meta)
    utf8 = _strict(body, "utf-8")
    for source, label in (("header", declared), ("meta", meta)):
        codec = _codec(label)
        if codec is None:
            continue
        if codec != "utf-8" and utf8 is not None and not utf8.isascii() and _is_single_byte(codec):
            return Decoded(utf8, "utf-8", "utf-8", meta)  # UTF-8 bytes behind a single-byte label
        text = _strict(body, codec)
        if text is not None:
            return Decoded(text, codec, source, meta)
    if utf8 is not None:
        return Decoded(utf8, "utf-8", "utf-8", meta)
    detected = _detect(body)
    if detected is not None:
        return Decoded(detected[0], detected[1], "detected", meta)
    return Decoded(body.decode("cp1252", errors="replace"), "cp1252", "fallback", meta)


def _detect(body: bytes) -> tuple[str, str] | None:
    try:
        import charset_normalizer
    except ImportError:  # optional: windows-1252 is the fallback without it
        return None
    best = charset_normalizer.from_bytes(body).best()
    if best is None:
        return None
    codec = _codec(best.encoding) or best.encoding
    text = _strict(body, codec)
    return (text, codec) if text is not None else None
