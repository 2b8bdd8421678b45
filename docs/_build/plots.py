"""Benchmark plots (stub during the first landing)."""

from __future__ import annotations

from pathlib import Path


def files(repo_root: Path) -> dict[str, bytes | str]:
    """Nothing yet."""
    return {}
