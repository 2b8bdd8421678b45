"""SQLAlchemy engines for the shop database and the warehouse (PostgreSQL or SQLite).

SQLite gets ``BEGIN IMMEDIATE`` for every transaction (the write lock is taken when the
transaction starts, so the fence check and the overwrite cannot interleave with another writer),
WAL journaling and a busy timeout. PostgreSQL uses its defaults; row locks come from
``SELECT ... FOR UPDATE`` in :mod:`onceflow.sales.partition_store`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with the transaction behaviour the partition loads rely on.

    :param url: SQLAlchemy URL, e.g. ``sqlite:////tmp/warehouse.db`` or ``postgresql+psycopg2://...``.
    :param kwargs: passed to :func:`sqlalchemy.create_engine`.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, **kwargs)
    engine = sa.create_engine(parsed, connect_args={"timeout": 60}, **kwargs)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
