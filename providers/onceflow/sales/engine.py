"""SQLAlchemy engines for the shop database and the warehouse (PostgreSQL or SQLite).

The transaction rules are the ledger's (:func:`onceflow.ledger.db.create_ledger_engine`), reused
rather than repeated: on SQLite every transaction starts with ``BEGIN IMMEDIATE`` (the write lock
is taken when the transaction starts, so the fence check and the overwrite cannot interleave with
another writer), WAL journaling and a busy timeout. PostgreSQL keeps its defaults; row locks come
from ``SELECT ... FOR UPDATE`` in :mod:`onceflow.sales.partition_store`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.ledger.db import create_ledger_engine

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with the transaction behaviour the partition loads rely on.

    :param url: SQLAlchemy URL, e.g. ``sqlite:////tmp/warehouse.db`` or ``postgresql+psycopg2://...``.
    :param kwargs: passed to :func:`sqlalchemy.create_engine`.
    """
    return create_ledger_engine(url, **kwargs)
