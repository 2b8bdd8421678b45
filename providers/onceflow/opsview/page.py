"""The page: the section documents rendered to HTML on the server (Jinja2, autoescaped).

Text from sheets, pages and errors is data: Jinja2 escapes every value, and a link is only made
from an ``http(s)://`` URL or one of Airflow's own paths (:func:`safe_href`); anything else (a
``javascript:`` URL a sheet cell may hold) is shown as text. The page refreshes itself every
:data:`REFRESH_S` seconds with a ``<meta>`` tag: no script runs on it at all, and a
``Content-Security-Policy`` header forbids any (:mod:`onceflow.opsview.api`).
"""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined

from onceflow.opsview import charts
from onceflow.opsview.questions import AGE_BUCKETS

REFRESH_S = 30


def safe_href(url: Any) -> str | None:
    """``url`` if a browser may follow it from the page, else None (then it is shown as text)."""
    # "//host" and "/\\host" (browsers read a backslash as a slash) leave Airflow for another site
    if (
        not isinstance(url, str)
        or not url
        or any(c in url for c in "\r\n\t")
        or url.startswith(("//", "/\\"))
    ):
        return None
    if url.startswith("/"):
        return url  # Airflow's own pages
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        return None
    return url if scheme in ("http", "https") else None


def duration(seconds: float | None) -> str:
    """``75`` -> ``1m 15s``; whole units, the two largest."""
    if seconds is None:
        return "-"
    s = int(seconds)
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def timestamp(value: float | str | None) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SS UTC`` (``-`` for none)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value).timestamp()
    return dt.datetime.fromtimestamp(value, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def hour_labels(now: float, hours: int) -> list[str]:
    """Labels of the ``hours`` hours before ``now``, oldest first."""
    start = now - hours * 3600
    return [
        dt.datetime.fromtimestamp(start + i * 3600, dt.timezone.utc).strftime("%d %H:00")
        for i in range(hours)
    ]


@cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("onceflow.opsview", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(duration=duration, timestamp=timestamp)
    env.globals.update(
        safe_href=safe_href, bars=charts.bars, hour_labels=hour_labels, age_buckets=AGE_BUCKETS
    )
    return env


def render(docs: dict[str, Any], now: float) -> str:
    """The whole page from the section documents (a section may be ``{"error": ...}`` or
    ``{"forbidden": True}``)."""
    return _environment().get_template("ops.html").render(d=docs, now=now, refresh=REFRESH_S)
