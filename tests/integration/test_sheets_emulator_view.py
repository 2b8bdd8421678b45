"""The emulator's read-only HTML view (issue 26 item 10) and its refusal of requests a web page
could forge (issue 30 item 5), over real HTTP against a running emulator."""

from __future__ import annotations

import http.client
import json
import urllib.request
from typing import Any
from urllib.parse import urlsplit

QUEUE = [
    ["url", "status", "reason", "published_url"],
    ["http://127.0.0.1:8765/articles/a.html", "DONE #1", "", "http://127.0.0.1:8765/published/a.html"],
    ["http://127.0.0.1:8765/notes.pdf", "FAILED #1", "not HTML", ""],
    ["<script>alert(1)</script>", "INVALID #0", "javascript:alert(2)", ""],
]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def _raw(
    endpoint: str, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, str]:
    """One request with exactly these headers (urllib would add its own Content-Type and Host)."""
    parts = urlsplit(endpoint)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {"Host": parts.netloc, **headers}.items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def _append_path(sid: str) -> str:
    return f"/v4/spreadsheets/{sid}/values/queue!A1:append?valueInputOption=RAW"


def test_the_root_lists_spreadsheets_and_each_opens_as_coloured_tables(sheets_emulator: Any) -> None:
    sid = sheets_emulator.create_spreadsheet("demo queue", sheets={"queue": QUEUE, "audit": [["time"]]})
    status, index = _get(sheets_emulator.endpoint)
    assert status == 200 and "demo queue" in index and f'href="/view/{sid}"' in index

    status, page = _get(sheets_emulator.endpoint + f"view/{sid}")
    assert status == 200
    assert "<h2>queue</h2>" in page and "<h2>audit</h2>" in page
    assert "background:#bbf7d0'>DONE #1<" in page  # DONE green
    assert "background:#fecaca'>FAILED #1<" in page  # FAILED red
    assert '<a href="http://127.0.0.1:8765/published/a.html"' in page
    # an editor's cell is text, never markup or a script link
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="javascript:' not in page


def test_an_unknown_spreadsheet_is_a_404_page(sheets_emulator: Any) -> None:
    status, page = _raw(sheets_emulator.endpoint, "GET", "/view/nope", None, {})
    assert status == 404 and "No spreadsheet nope" in page


def test_a_cross_site_text_plain_append_is_refused_and_adds_no_row(sheets_emulator: Any) -> None:
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": QUEUE})
    body = json.dumps({"values": [["http://evil.example/", "NEW"]]}).encode()
    # what a form or a no-preflight fetch() on another site makes the browser send
    status, text = _raw(
        sheets_emulator.endpoint,
        "POST",
        _append_path(sid),
        body,
        {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example"},
    )
    assert status == 403 and "cross-origin" in text
    status, text = _raw(
        sheets_emulator.endpoint, "POST", _append_path(sid), body, {"Content-Type": "text/plain"}
    )
    assert status == 415 and "application/json" in text
    _, values = _get(sheets_emulator.endpoint + f"v4/spreadsheets/{sid}/values/queue")
    assert "evil.example" not in values


def test_a_rebinding_host_name_is_refused_even_for_reads(sheets_emulator: Any) -> None:
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": QUEUE})
    status, text = _raw(
        sheets_emulator.endpoint,
        "GET",
        f"/v4/spreadsheets/{sid}/values/queue",
        None,
        {"Host": "rebind.evil.example"},
    )
    assert status == 421 and "rebind.evil.example" in text


def test_a_json_write_from_a_client_that_is_not_a_browser_still_works(sheets_emulator: Any) -> None:
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": QUEUE})
    body = json.dumps({"values": [["http://127.0.0.1:8765/articles/b.html", "NEW"]]}).encode()
    status, _ = _raw(
        sheets_emulator.endpoint, "POST", _append_path(sid), body, {"Content-Type": "application/json"}
    )
    assert status == 200
    _, values = _get(sheets_emulator.endpoint + f"v4/spreadsheets/{sid}/values/queue")
    assert "articles/b.html" in values
