"""The documentation site, built once per test session (``mkdocs build --strict``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_site import Build, build_site


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The strict build of this repository's site, into a temporary folder."""
    return build_site(tmp_path_factory.mktemp("docs") / "site")


@pytest.fixture(scope="session")
def site_dir(built_site: Build) -> Path:
    """The built site's folder; fails (once per test) when the strict build did."""
    assert built_site.returncode == 0, built_site.output
    return built_site.site_dir
