"""Build the documentation site, and check a built site's internal links and anchors.

The build is ``mkdocs build --strict`` (mkdocs.yml), the same command as ``make docs``: a warning,
a link to a missing page or a missing anchor in the Markdown fails it. ``broken_links`` then reads
the built HTML itself, so links in generated pages (the reference, source pages, the theme's
navigation) are checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Build:
    """One strict build: where the site went and what mkdocs printed."""

    site_dir: Path
    returncode: int
    output: str


def build_site(site_dir: Path, config: Path = REPO_ROOT / "mkdocs.yml") -> Build:
    """``mkdocs build --strict`` into ``site_dir``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site_dir),
        ],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Build(site_dir, proc.returncode, proc.stdout + proc.stderr)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link")) or (name == "src" and tag in ("img", "script")):
                self.links.append(value)


def parse_page(path: Path) -> tuple[set[str], list[str]]:
    """The ids and the link targets (href/src) of one HTML file."""
    parser = _Page()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser.ids, parser.links


def broken_links(site_dir: Path) -> list[str]:
    """Every internal link of the built site whose file or anchor does not exist, as text."""
    pages = {p: parse_page(p) for p in site_dir.rglob("*.html")}
    problems = []
    for page, (_, links) in sorted(pages.items()):
        for link in links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            path = unquote(parts.path)
            # Absolute paths (the theme's 404 page has them) are relative to the site's root.
            base = site_dir if path.startswith("/") else page.parent
            target = (base / path.lstrip("/")).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(site_dir)}: {link}"
            if not target.is_file():
                problems.append(f"{where} -> no such file")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target][0] if target in pages else parse_page(target)[0]
                if fragment not in ids:
                    problems.append(f"{where} -> no anchor #{fragment}")
    return problems
