"""Named SQL queries loaded from ``sql/*.sql`` (procrastinate style).

A file holds blocks that start with ``-- name: <query_name>``; the text up to the next such line is
the query. Parameters use SQLAlchemy's ``:name`` style so the same text runs on both dialects.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from sqlalchemy import TextClause, text

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def _all_queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in resources.files("onceflow.ledger").joinpath("sql").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text(encoding="utf-8"))
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=False):
            if name in found:
                raise ValueError(f"query {name!r} defined twice")
            found[name] = body.strip().rstrip(";")
    return found


def query(name: str) -> TextClause:
    """Return the named query as a SQLAlchemy text clause."""
    try:
        return text(_all_queries()[name])
    except KeyError:
        raise KeyError(f"no query named {name!r} in onceflow/ledger/sql/*.sql") from None


def query_names() -> list[str]:
    """The names of every named query in the ledger's ``.sql`` files."""
    return sorted(_all_queries())
