"""The database's copy of the state machine agrees with ``states.STATE_TABLE`` (issue 22).

The guards in ``sql/guards.sql`` and the event CHECK list the allowed (from, to) pairs and the
events as literal SQL (a released guard is never edited, so they cannot be generated at run time);
this test fails when the state table changes and the database's copy does not.
"""

from __future__ import annotations

import re

from onceflow.ledger import schema, states
from onceflow.ledger.queries import query


def _table_pairs() -> set[str]:
    return {
        f"{source}>{t.target}"
        for t in states.STATE_TABLE
        if t.target is not None
        for source in t.sources
        if source is not None and source != t.target
    }


def test_every_state_machine_guard_lists_exactly_the_pairs_of_the_state_table() -> None:
    for name in ("guard_state_machine_function_postgresql", "guard_state_machine_pairs_trigger_sqlite"):
        listed = set(re.findall(r"'([a-z_]+>[a-z_]+)'", str(query(name))))
        assert listed == _table_pairs(), name


def test_the_event_check_lists_exactly_the_events_of_the_state_table() -> None:
    _table, check = schema.CHECKS["ck_transitions_event"]
    assert set(re.findall(r"'([a-z_]+)'", check)) == set(states.BY_EVENT)
