"""SQLAlchemy engines for the shop database and the warehouse (PostgreSQL or SQLite).

The transaction rules are the ledger's (:func:`onceflow.ledger.db.create_ledger_engine`), reused
rather than repeated: on SQLite every transaction starts with ``BEGIN IMMEDIATE`` (the write lock
is taken when the transaction starts, so the fence check and the overwrite cannot interleave with
another writer), WAL journaling and a busy timeout. PostgreSQL keeps its defaults; row locks come
from ``SELECT ... FOR UPDATE`` in :mod:`onceflow.sales.fencing`. The shop database is only ever
read, through :func:`make_source_engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.ledger.db import create_ledger_engine
from onceflow.sales.deadlines import Deadlines, install

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def make_engine(url: str, *, deadlines: Deadlines | None = None, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with the transaction behaviour the partition loads rely on.

    :param url: SQLAlchemy URL, e.g. ``sqlite:////tmp/warehouse.db`` or ``postgresql+psycopg2://...``.
    :param deadlines: per-statement lock and statement timeouts (default: from the environment,
        :mod:`onceflow.sales.deadlines`).
    :param kwargs: passed to :func:`sqlalchemy.create_engine`.
    """
    return install(create_ledger_engine(url, **kwargs), "warehouse", deadlines)


def make_source_engine(url: str, *, deadlines: Deadlines | None = None, **kwargs: Any) -> Engine:
    """A read-only engine for the shop database: one consistent snapshot per transaction, no locks.

    SQLite files are opened read-only (``mode=ro``) with a plain deferred ``BEGIN``: no write lock,
    no ``journal_mode`` switch, so the shop's file is exactly as the shop left it. PostgreSQL
    transactions are ``REPEATABLE READ READ ONLY``: the watermark and the rows come from one
    snapshot, and a write through this engine is refused by the server.

    :param url: SQLAlchemy URL of the shop database.
    :param deadlines: per-statement lock and statement timeouts (PostgreSQL; default: environment).
    :param kwargs: passed to :func:`sqlalchemy.create_engine`.
    """
    import os
    import urllib.parse

    import sqlalchemy as sa
    from sqlalchemy import event

    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        kwargs.setdefault("isolation_level", "REPEATABLE READ")
        options = {"postgresql_readonly": True, **kwargs.pop("execution_options", {})}
        return install(sa.create_engine(url, execution_options=options, **kwargs), "shop", deadlines)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        raise ValueError(f"the shop database must be a SQLite file, not {url!r}")
    if not database.startswith("file:"):
        path = urllib.parse.quote(os.path.abspath(database))
        parsed = parsed.set(database=f"file:{path}", query={"mode": "ro", "uri": "true"})
    engine = sa.create_engine(parsed, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN
        # SQLite stores any bytes as TEXT; a value that is not UTF-8 would fail the whole read on
        # every retry. Keep its bytes as lone surrogates instead: cleaning rejects the row.
        dbapi_connection.text_factory = lambda raw: raw.decode("utf-8", "surrogateescape")
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 60000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")  # deferred: a read snapshot, never the write lock

    return engine
