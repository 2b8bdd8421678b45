"""MkDocs hooks (mkdocs.yml ``hooks:``): the pages generated from the repository at build time.

- ``source/<path>.md``: each repository file a page links to (``sources.py``);
- ``reference/**``: the reference, generated from the code (``reference.py``);
- the benchmark plots (``plots.py``).

Nothing generated is written into docs/: every page is a virtual file of this build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

BUILD_DIR = Path(__file__).resolve().parent
if str(BUILD_DIR) not in sys.path:
    sys.path.insert(0, str(BUILD_DIR))

import plots  # noqa: E402
import reference  # noqa: E402
import sources  # noqa: E402

REPO_ROOT = BUILD_DIR.parent.parent


def _docs_dir(config: MkDocsConfig) -> Path:
    return Path(config["docs_dir"]).resolve()


def _nav_uris(items: Any) -> set[str]:
    found: set[str] = set()
    for item in items or []:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        found |= _nav_uris(value) if isinstance(value, list) else {value}
    return found


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    reference.extend_nav(config)
    # A topic page added under docs/ without a nav entry still gets one (under Guides), so no page
    # of the site is unreachable and a new page cannot break the strict build.
    listed = _nav_uris(config["nav"])
    missing = sorted(p.name for p in _docs_dir(config).glob("*.md") if p.name not in listed)
    for item in config["nav"] or []:
        if isinstance(item, dict) and isinstance(item.get("Guides"), list):
            item["Guides"] += missing
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    docs_dir = _docs_dir(config)
    generated: dict[str, str | bytes] = {}
    generated.update(reference.pages(REPO_ROOT))
    generated.update(plots.files(REPO_ROOT))
    markdown = {
        f.src_uri: f.content_string
        for f in files
        if f.src_uri.endswith(".md") and not f.src_uri.startswith("_build/")
    }
    markdown.update(
        {uri: text for uri, text in generated.items() if uri.endswith(".md") and isinstance(text, str)}
    )
    for repo_path in sorted(sources.linked_files(markdown, docs_dir, REPO_ROOT)):
        generated[sources.source_page_uri(repo_path)] = sources.source_page(repo_path, REPO_ROOT)
    for uri, content in generated.items():
        # Source pages are reached by links, not by the navigation.
        level = (
            InclusionLevel.NOT_IN_NAV
            if uri.startswith(sources.SOURCE_DIR + "/")
            else InclusionLevel.UNDEFINED
        )
        files.append(File.generated(config, uri, content=content, inclusion=level))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **_: Any) -> str:
    return sources.rewrite_links(markdown, page.file.src_uri, _docs_dir(config), REPO_ROOT)
