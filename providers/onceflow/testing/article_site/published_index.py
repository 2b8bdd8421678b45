"""The published pages as a reader's index: each page's title and link, newest first.

``/published/`` of the demo site (``make run``) used to be a bare directory listing of hashed
file names; a reader wants the titles. A title is read from the page's ``<title>`` (escaped again
here: published pages are sanitised, but this index trusts no file it did not write).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
#: Bytes read from each page to find its title.
HEAD_BYTES = 65536


def page_title(path: Path) -> str:
    """The page's ``<title>`` text (entities decoded, whitespace collapsed), else its file name."""
    with path.open("rb") as fh:
        head = fh.read(HEAD_BYTES).decode("utf-8", errors="replace")
    found = _TITLE.search(head)
    title = " ".join(html.unescape(found.group(1)).split()) if found else ""
    return title or path.name


def published_index(root: Path, url_prefix: str = "/published/") -> str:
    """An HTML page listing every ``.html`` file under ``root`` by title, newest first."""
    pages = sorted(
        (p for p in root.rglob("*.html") if p.is_file() and p.resolve().is_relative_to(root)),
        key=lambda p: (-p.stat().st_mtime_ns, p.as_posix()),
    )
    items = "".join(
        f'<li><a href="{html.escape(url_prefix + p.relative_to(root).as_posix())}">'
        f"{html.escape(page_title(p))}</a></li>"
        for p in pages
    )
    body = f"<ol>{items}</ol>" if items else "<p>Nothing published yet.</p>"
    return (
        '<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">'
        "<title>Published articles</title></head><body><h1>Published articles</h1>"
        f"{body}<p><a href='/'>Demo articles</a></p></body></html>\n"
    )
