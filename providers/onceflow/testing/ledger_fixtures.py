"""pytest fixtures for the work ledger; registered by ``onceflow.testing.pytest_plugin``.

* ``onceflow_fake_clock``: a :class:`~onceflow.testing.clock.FakeClock` (time moves only when told).
* ``onceflow_ledger_url``: a fresh, empty ledger database URL, parametrised over SQLite (a temp file)
  and PostgreSQL (``onceflow_postgres_url``; those cases carry the ``postgres`` mark).
* ``onceflow_ledger``: a migrated :class:`~onceflow.ledger.Ledger` on ``onceflow_ledger_url`` using ``onceflow_fake_clock``.
* ``onceflow_sqlite_ledger``: the same on SQLite only, for tests that do not need both backends.

Users can write ``def test_my_task(onceflow_ledger): ...`` and get both databases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported when a fixture is used (the plugin loads this module everywhere)
    from collections.abc import Iterator
    from pathlib import Path

    from onceflow.ledger import Ledger
    from onceflow.testing.clock import FakeClock

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture
def onceflow_fake_clock() -> FakeClock:
    from onceflow.testing.clock import FakeClock

    return FakeClock()


@pytest.fixture(params=BACKENDS)
def onceflow_ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("onceflow_postgres_url"))


def _open(url: str, clock: FakeClock) -> Iterator[Ledger]:
    from onceflow.ledger import Ledger, create_ledger_engine

    engine = create_ledger_engine(url)
    try:
        yield Ledger(engine, clock=clock)
    finally:
        engine.dispose()


@pytest.fixture
def onceflow_ledger(onceflow_ledger_url: str, onceflow_fake_clock: FakeClock) -> Iterator[Ledger]:
    yield from _open(onceflow_ledger_url, onceflow_fake_clock)


@pytest.fixture
def onceflow_sqlite_ledger(tmp_path: Path, onceflow_fake_clock: FakeClock) -> Iterator[Ledger]:
    yield from _open(f"sqlite:///{tmp_path / 'ledger.db'}", onceflow_fake_clock)
