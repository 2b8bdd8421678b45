"""The work ledger behind the plugin's ledger fixtures (``onceflow.testing.pytest_plugin`` declares
them and imports this module when one is used).

* ``onceflow_fake_clock``: a :class:`~onceflow.testing.clock.FakeClock` (time moves only when told).
* ``onceflow_ledger_url``: a fresh, empty ledger database URL, parametrised over SQLite (a temp file)
  and PostgreSQL (``onceflow_postgres_url``; those cases carry the ``postgres`` mark).
* ``onceflow_ledger``: a migrated :class:`~onceflow.ledger.Ledger` on ``onceflow_ledger_url`` using ``onceflow_fake_clock``.
* ``onceflow_sqlite_ledger``: the same on SQLite only, for tests that do not need both backends.

Users can write ``def test_my_task(onceflow_ledger): ...`` and get both databases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import pytest

    from onceflow.ledger import Ledger
    from onceflow.testing.clock import FakeClock


def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """``onceflow_ledger_url`` for its parameter, ``sqlite`` or ``postgresql``."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("onceflow_postgres_url"))


def open_ledger(url: str, clock: FakeClock) -> Iterator[Ledger]:
    """A :class:`~onceflow.ledger.Ledger` on ``url`` (its engine disposed at teardown)."""
    from onceflow.ledger import Ledger, create_ledger_engine

    engine = create_ledger_engine(url)
    try:
        yield Ledger(engine, clock=clock)
    finally:
        engine.dispose()
