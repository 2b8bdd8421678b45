"""Throwaway PostgreSQL databases for tests.

Every test run gets databases of its own (``onceflow_<tag>_<random>``) on the server named by
``ONCEFLOW_TEST_DATABASE_URL`` (default: the local server on 127.0.0.1:5432 as user postgres), so
concurrent runs on one machine never see each other's tables.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator

from sqlalchemy.engine import URL, make_url

from onceflow.testing.ci import in_ci

ENV_VAR = "ONCEFLOW_TEST_DATABASE_URL"
DEFAULT_SERVER_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"


class PostgresUnavailable(RuntimeError):
    """The test PostgreSQL server could not be reached."""


def server_url() -> URL:
    """The maintenance URL of the test server: ``ONCEFLOW_TEST_DATABASE_URL`` or the local default."""
    url = make_url(os.environ.get(ENV_VAR) or DEFAULT_SERVER_URL)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg2")
    return url


def postgres_required() -> bool:
    """In CI (or when the URL is given explicitly) a missing server is a failure, never a skip."""
    return bool(os.environ.get(ENV_VAR)) or in_ci()


def _connect(url: URL):  # type: ignore[no-untyped-def]
    import psycopg2

    try:
        conn = psycopg2.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            user=url.username or "postgres",
            password=url.password or None,
            dbname=url.database or "postgres",
            connect_timeout=5,
        )
    except psycopg2.OperationalError as exc:
        raise PostgresUnavailable(
            f"cannot reach PostgreSQL at {url.render_as_string(hide_password=True)}: {exc}"
        ) from exc
    conn.autocommit = True
    return conn


def is_available() -> bool:
    try:
        _connect(server_url()).close()
    except PostgresUnavailable:
        return False
    return True


def create_database(tag: str = "test") -> str:
    """Create an empty database and return its SQLAlchemy URL (``postgresql+psycopg2://...``).

    :param tag: a short word naming the user of the database, kept in its name for debugging.
    """
    safe_tag = "".join(ch for ch in tag.lower() if ch.isalnum() or ch == "_")[:20] or "test"
    name = f"onceflow_{safe_tag}_{secrets.token_hex(4)}"
    base = server_url()
    conn = _connect(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return base.set(database=name).render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    """Drop a database made by :func:`create_database`, ending any session still connected to it."""
    name = make_url(url).database
    if not name or not name.startswith("onceflow_"):
        raise ValueError(f"refusing to drop a database onceflow did not create: {name!r}")
    conn = _connect(server_url())
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        conn.close()


def url_factory() -> Iterator[Callable[..., str]]:
    """The ``onceflow_postgres_url_factory`` fixture (``onceflow.testing.pytest_plugin``):
    ``factory(tag="test")`` -> URL of a fresh empty database, each one dropped at teardown; an
    unreachable server fails the test where :func:`postgres_required`, and skips it elsewhere."""
    import pytest

    created: list[str] = []

    def factory(tag: str = "test") -> str:
        try:
            url = create_database(tag)
        except PostgresUnavailable as exc:
            if postgres_required():
                pytest.fail(f"PostgreSQL is required here: {exc}", pytrace=False)
            pytest.skip(f"PostgreSQL unavailable: {exc}")
        created.append(url)
        return url

    yield factory
    for url in created:
        with contextlib.suppress(PostgresUnavailable):
            drop_database(url)
