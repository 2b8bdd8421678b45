"""A new SQLite connection switches its file to WAL even when the switch is refused at first.

SQLite refuses the switch with "database is locked" without waiting (no busy handler) while other
processes are opening the same new file; six schema creators racing on one warehouse failed this
way in CI. The refusals here come from a real ``sqlite3`` connection whose cursor refuses the first
switches (the race itself cannot be made to happen on demand); the file's mode is read back through
a second, independent connection.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from onceflow.ledger.db import create_ledger_engine, use_wal


class _RefusingCursor(sqlite3.Cursor):
    refusals = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.replace(" ", "").upper() == "PRAGMAJOURNAL_MODE=WAL" and _RefusingCursor.refusals > 0:
            _RefusingCursor.refusals -= 1
            raise sqlite3.OperationalError("database is locked")
        return super().execute(sql, *args)


class _RefusingConnection(sqlite3.Connection):
    def cursor(self, factory: Any = _RefusingCursor) -> Any:
        return super().cursor(factory)


def _mode(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])


def test_a_refused_switch_is_retried_until_the_file_is_in_wal(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.db"
    _RefusingCursor.refusals = 3
    engine = create_ledger_engine(f"sqlite:///{path}", connect_args={"factory": _RefusingConnection})
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
    engine.dispose()
    assert _RefusingCursor.refusals == 0, "the refusals were never met: the test proves nothing"
    assert _mode(path) == "wal"


def test_a_switch_refused_past_the_deadline_fails_with_sqlite_s_error(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.db"
    _RefusingCursor.refusals = 10**6
    conn = sqlite3.connect(path, factory=_RefusingConnection)
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            use_wal(conn, timeout_s=0.2)
    finally:
        conn.close()
        _RefusingCursor.refusals = 0
    assert _mode(path) == "delete"


def test_other_errors_are_not_retried_and_memory_databases_keep_their_mode() -> None:
    conn = sqlite3.connect(":memory:")
    use_wal(conn, timeout_s=0)  # "memory" cannot become WAL: no loop, no error
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "memory"
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError):
        use_wal(conn, timeout_s=5)  # a closed connection: raised at once, not waited on
