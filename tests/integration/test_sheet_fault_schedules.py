"""Generated fault schedules against the sheet queue, its write-back and the ledger (issue 22).

``onceflow.testing.sheet_faults`` turns a seed into claimers, an editor, emulator faults, the
metadata cap, edits landing between a write-back's read and its write, crashed and paused workers;
plays it against the Sheets emulator (real google-api-python-client over HTTP) and a real SQLite
ledger; brings every row to rest; and checks the promises (see its module docstring). A failure
names every failing seed and how to replay one: ``python -m onceflow.testing.sheet_faults --seed N``.
200 schedules here; 10,000 in ``make test-slow``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.testing.sheet_faults import ScheduleFailed, run_schedule, services

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from onceflow.testing.sheets_fixtures import SheetsEmulator


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> Iterator[Ledger]:
    engine = create_ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def _run(emulator: SheetsEmulator, ledger: Ledger, seeds: range) -> None:
    clients = services(emulator)
    failed: list[str] = []
    for seed in seeds:
        emulator.faults.clear()
        try:
            run_schedule(emulator, ledger, seed, clients=clients)
        except ScheduleFailed as err:
            failed.append(str(err))
    assert not failed, f"{len(failed)} of {len(seeds)} schedules broke a promise; first:\n{failed[0]}"


def test_200_generated_fault_schedules_keep_every_promise(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    _run(sheets_emulator, sqlite_ledger, range(200))


@pytest.mark.slow
def test_10000_generated_fault_schedules_keep_every_promise(
    sheets_emulator_factory: object, sqlite_ledger: Ledger
) -> None:
    emulator = sheets_emulator_factory(state=None)  # type: ignore[operator]
    _run(emulator, sqlite_ledger, range(200, 10_200))


def test_a_failing_seed_is_named_with_its_replay_command(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """A schedule that breaks a promise (here: the check is handed a row left in flight by an
    editor's status typed back to PROCESSING under a token no claim made) names its seed."""
    run = run_schedule(sheets_emulator, sqlite_ledger, 3, clients=services(sheets_emulator))
    assert run.seed == 3 and not run.violations
    from onceflow.sheets.model import Snapshot
    from onceflow.testing.sheet_faults import check

    sid = next(iter(sheets_emulator.server.store.spreadsheets))
    book = sheets_emulator.server.store.spreadsheets[sid]
    run.tokens_seen.add("20261202T000000Z-0000000000-v1")
    check(run, Snapshot.from_values(sheets_emulator.values(sid, "queue")), book, sqlite_ledger)
    assert any("no claim handed out" in v for v in run.violations)
