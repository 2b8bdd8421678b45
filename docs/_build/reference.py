"""The reference, generated from the code at build time (stub during the first landing)."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig


def extend_nav(config: MkDocsConfig) -> None:
    """Nothing yet."""


def pages(repo_root: Path) -> dict[str, str]:
    """Nothing yet."""
    return {}
