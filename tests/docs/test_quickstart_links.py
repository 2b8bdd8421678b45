"""The built quickstart, opened in headless Chromium: every link on it leads to a page that exists
and to an anchor that is on that page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_links import CHROMIUM, CHROMIUM_ARGS, follow_links, serve


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def test_every_link_of_the_built_quickstart_opens_a_page_and_its_anchor(
    site_dir: Path, browser: object
) -> None:
    with serve(site_dir) as base:
        followed, problems = follow_links(browser, base + "quickstart.html")
    assert problems == []
    # the quickstart's own links into the rest of the site, not only the theme's navigation
    for expected in ("concepts.html#claim-before-work-and-the-conditional-claim", "runbook.html#row-failed"):
        assert any(link.endswith(expected) for link in followed), expected
    assert len(followed) > 30


def test_a_missing_page_a_missing_anchor_and_an_outside_link_are_reported(
    tmp_path: Path, browser: object
) -> None:
    (tmp_path / "start.html").write_text(
        '<a href="other.html#here">ok</a> <a href="other.html#gone">no anchor</a>'
        ' <a href="missing.html">no page</a> <a href="https://example.invalid/">outside</a>'
    )
    (tmp_path / "other.html").write_text('<h2 id="here">here</h2>')
    with serve(tmp_path) as base:
        _, problems = follow_links(browser, base + "start.html")
    assert problems == [
        "https://example.invalid/: leaves the site",
        f"{base}missing.html: status 404",
        f"{base}other.html#gone: no such anchor",
    ]
