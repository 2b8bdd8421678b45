"""The demo article site behind the plugin's ``onceflow_article_site`` fixture
(``onceflow.testing.pytest_plugin`` declares it and imports this module when it is used).

``onceflow_article_site`` serves the demo site on a free 127.0.0.1 port for one test, with
``tmp_path / "published"`` under ``/published/``, and sets the ``onceflow_fetch`` connection so
that ``FetchHook()`` may fetch from it (and from nothing else private)::

    def test_it_fetches(onceflow_article_site):
        page = FetchHook().fetch(onceflow_article_site.url("/articles/gazpacho.html"))
        assert "Gazpacho" in page.text
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import pytest

    from onceflow.testing.article_site import ArticleSite

FETCH_CONN_ID = "onceflow_fetch"


def fetch_connection_json(site: ArticleSite, **extra: Any) -> str:
    """The ``AIRFLOW_CONN_ONCEFLOW_FETCH`` value that allows ``site`` (plus any other extras)."""
    return json.dumps({"conn_type": "generic", "extra": {"allow": [site.address], **extra}})


def article_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArticleSite]:
    """``onceflow_article_site``: the site for one test, allowed by the ``onceflow_fetch`` connection."""
    from onceflow.testing.article_site import serve

    published = tmp_path / "published"
    published.mkdir()
    with serve(published_dir=published) as site:
        monkeypatch.setenv(f"AIRFLOW_CONN_{FETCH_CONN_ID.upper()}", fetch_connection_json(site))
        yield site
