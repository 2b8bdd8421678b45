"""Follow every link of a page of the built site in headless Chromium (Debian's /usr/bin/chromium
through Playwright; no browser download), the way a reader clicks them.

``serve`` puts a site folder on 127.0.0.1 with the standard library's HTTP server; ``follow_links``
opens a page, collects every ``<a href>`` the browser sees on it (navigation, table of contents,
content), opens each target page and reports a status other than 200, a fragment with no element
of that id on the target, and any link that leaves the site.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(site_dir: Path) -> Iterator[str]:
    """The site on ``http://127.0.0.1:<free port>/`` until the block ends."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def follow_links(browser: object, start_url: str) -> tuple[list[str], list[str]]:
    """(every link followed, every problem) for the page at ``start_url``."""
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        response = page.goto(start_url)
        if response is None or response.status != 200:
            return [], [f"{start_url}: status {None if response is None else response.status}"]
        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        origin = urlsplit(start_url).netloc
        problems: list[str] = []
        by_target: dict[str, set[str]] = {}
        for href in hrefs:
            if urlsplit(href).netloc != origin or urlsplit(href).scheme not in ("http", "https"):
                problems.append(f"{href}: leaves the site")
                continue
            target, fragment = urldefrag(href)
            by_target.setdefault(target, set()).add(fragment)
        for target, fragments in sorted(by_target.items()):
            response = page.goto(target)
            status = None if response is None else response.status
            if status != 200:
                problems.append(f"{target}: status {status}")
                continue
            for fragment in sorted(f for f in fragments if f):
                found = page.evaluate(
                    "f => document.getElementById(decodeURIComponent(f)) !== null", fragment
                )
                if not found:
                    problems.append(f"{target}#{fragment}: no such anchor")
        return sorted(hrefs), problems
    finally:
        page.close()
