"""The embedded demo article site: real pages written for the project, served on 127.0.0.1.

Spanish articles (one long enough to need chunking), a few in Catalan and Portuguese, images,
tables and lists, plus the bad inputs the fetch step must refuse or survive: a broken page, a
page with scripts and event handlers, a title that is a spreadsheet formula, wrong declared
encodings, a PDF, a CSV, redirects (one to a private address), 404s, and endless or huge
responses. ``make run`` serves it with the published pages under ``/published/``::

    with serve(published_dir="/tmp/published") as site:
        fetch_page(site.url("/articles/gazpacho.html"), policy)

Command line: ``python -m onceflow.testing.article_site --port 8765``.
"""

from __future__ import annotations

from onceflow.testing.article_site.catalog import ARTICLES, FILES, Entry
from onceflow.testing.article_site.server import Access, ArticleSite, serve

__all__ = ["ARTICLES", "FILES", "Access", "ArticleSite", "Entry", "serve"]
