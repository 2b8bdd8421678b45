"""The second thread of ``bulk_load.copy_chunks`` (it formats the rows while the driver sends) never
outlives the call: whatever fails, the call ends with the thread stopped, and the error raised."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from onceflow.sales.bulk_load import copy_chunks


def rows_thread_alive() -> bool:
    return any(t.name == "onceflow-copy-rows" and t.is_alive() for t in threading.enumerate())


def endless() -> Iterator[bytes]:
    while True:
        yield b"x\n"


def fake_conn(cursor: Any) -> Any:
    dbapi = SimpleNamespace(cursor=cursor)
    return SimpleNamespace(
        dialect=SimpleNamespace(name="postgresql", driver="psycopg2"),
        connection=SimpleNamespace(dbapi_connection=dbapi, info={}),
    )


def test_a_cursor_that_cannot_be_opened_leaves_no_formatting_thread() -> None:
    """The connection was closed (psycopg2 raises InterfaceError from cursor()): the thread was
    started before the cursor and outside the try that stops it, so it stayed, a chunk or two
    ahead, polling its queue every 0.1 s for the life of the worker."""

    def closed() -> Any:
        raise RuntimeError("connection already closed")

    assert not rows_thread_alive()
    with pytest.raises(RuntimeError, match="already closed"):
        copy_chunks(fake_conn(closed), '"daily_sales"', endless())
    deadline = time.monotonic() + 2
    while rows_thread_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not rows_thread_alive()


def test_a_failing_copy_stops_the_formatting_thread() -> None:
    class Cursor:
        def copy_expert(self, _sql: str, reader: Any, size: int = 0) -> None:
            reader.read()
            raise RuntimeError("server closed the connection unexpectedly")

        def close(self) -> None:
            pass

    with pytest.raises(RuntimeError, match="server closed"):
        copy_chunks(fake_conn(Cursor), '"daily_sales"', endless())
    assert not rows_thread_alive()
