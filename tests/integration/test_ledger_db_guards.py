"""The ledger database itself enforces the state machine (issue 22, defect 6).

Each row of ``ILLEGAL`` is a plain-SQL write that the state model forbids and that the database
accepted before ``ledger_v6`` (only state names, a non-negative token that never goes down, were
enforced). Run on SQLite and PostgreSQL (``ledger_url``'s two backends): the write is refused
with an ``IntegrityError`` and nothing changed. The legal writes the code makes are exercised by
the rest of the ledger suite (its hypothesis state machine included) under the same guards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

if TYPE_CHECKING:
    from onceflow.ledger import Ledger

#: (what it would break, SQL); items: d:1 done (with its result), p:1 pending, l:1 leased (current)
ILLEGAL: list[tuple[str, str]] = [
    (
        "done -> leased with no owner and no expiry",
        "UPDATE work_items SET state = 'leased' WHERE work_key = 'd:1'",
    ),
    (
        "done -> leased, even with owner, expiry and a new token",
        "UPDATE work_items SET state = 'leased', lease_owner = 'x', lease_expires_at = 1e12,"
        " fencing_token = fencing_token + 1 WHERE work_key = 'd:1'",
    ),
    ("done -> failed", "UPDATE work_items SET state = 'failed' WHERE work_key = 'd:1'"),
    ("pending -> done without a result", "UPDATE work_items SET state = 'done' WHERE work_key = 'p:1'"),
    (
        "pending -> needs_correction",
        "UPDATE work_items SET state = 'needs_correction' WHERE work_key = 'p:1'",
    ),
    (
        "attempts above max_attempts",
        "UPDATE work_items SET attempts = max_attempts + 1 WHERE work_key = 'p:1'",
    ),
    ("max_attempts 0", "UPDATE work_items SET max_attempts = 0, attempts = 0 WHERE work_key = 'p:1'"),
    (
        "a fencing-token jump while leased",
        "UPDATE work_items SET fencing_token = fencing_token + 1 WHERE work_key = 'l:1'",
    ),
    (
        "a token rising by two",
        "UPDATE work_items SET fencing_token = fencing_token + 2 WHERE work_key = 'd:1'",
    ),
    (
        "a token rising outside a lease",
        "UPDATE work_items SET fencing_token = fencing_token + 1 WHERE work_key = 'p:1'",
    ),
    (
        "pending -> leased without a new token",
        "UPDATE work_items SET state = 'leased', lease_owner = 'x', lease_expires_at = 1e12 WHERE work_key = 'p:1'",
    ),
    (
        "a lease handed to another owner without a new token",
        "UPDATE work_items SET lease_owner = 'thief' WHERE work_key = 'l:1'",
    ),
    ("leased with no owner", "UPDATE work_items SET lease_owner = NULL WHERE work_key = 'l:1'"),
    ("leased with no expiry", "UPDATE work_items SET lease_expires_at = NULL WHERE work_key = 'l:1'"),
    (
        "an item created done",
        "INSERT INTO work_items (work_key, kind, state, priority, available_at, fencing_token, attempts,"
        " max_attempts, created_at, updated_at, lane) VALUES ('n:1', 'k', 'done', 0, 0, 0, 0, 5, 0, 0, 'new')",
    ),
    (
        "an item created with a token",
        "INSERT INTO work_items (work_key, kind, state, priority, available_at, fencing_token, attempts,"
        " max_attempts, created_at, updated_at, lane) VALUES ('n:2', 'k', 'pending', 0, 0, 7, 0, 5, 0, 0, 'new')",
    ),
    (
        "a transition row of an unknown kind",
        "INSERT INTO transitions (work_key, event, from_state, to_state, actor, at)"
        " VALUES ('p:1', 'teleport', 'pending', 'done', 'worker', 0)",
    ),
    ("DELETE FROM transitions", "DELETE FROM transitions"),
    ("rewriting a transition", "UPDATE transitions SET event = 'complete' WHERE event = 'create'"),
]


def _state(ledger: Ledger) -> Any:
    with ledger.engine.connect() as conn:
        return [
            conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY id")).all()
            for t in ("work_items", "transitions")
        ]


@pytest.fixture
def items(ledger: Ledger) -> Ledger:
    for key in ("d:1", "p:1", "l:1"):
        ledger.add(key.split(":")[0], key)  # one kind each, so each claim takes the item meant
    done = ledger.claim("d", "w1", 600, "v1")
    assert done is not None
    ledger.commit_result(done, "s", {"ok": True})
    assert ledger.claim("l", "w2", 600, "v1") is not None
    assert [ledger.item(k).state for k in ("d:1", "p:1", "l:1")] == ["done", "pending", "leased"]
    return ledger


@pytest.mark.parametrize(("breaks", "statement"), ILLEGAL, ids=[b for b, _ in ILLEGAL])
def test_an_illegal_plain_sql_write_is_refused_and_changes_nothing(
    items: Ledger, breaks: str, statement: str
) -> None:
    before = _state(items)
    with pytest.raises(sa.exc.IntegrityError), items.engine.begin() as conn:
        conn.exec_driver_sql(statement)
    assert _state(items) == before, breaks


# PostgreSQL only: SQLite has no TRUNCATE (its DELETE is refused above).
@pytest.mark.postgres
@pytest.mark.parametrize("onceflow_ledger_url", ["postgresql"], indirect=True)
def test_truncating_transitions_is_refused_on_postgresql(items: Ledger) -> None:
    assert items.engine.dialect.name == "postgresql"
    with pytest.raises(sa.exc.IntegrityError), items.engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE transitions")
