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
from onceflow.testing.sheet_faults import ScheduleFailed, run_many, run_schedule, services

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


def _run(seeds: range, root: Path) -> None:
    failed = run_many(seeds, root)
    assert not failed, (
        f"{len(failed)} (or more) of {len(seeds)} schedules broke a promise; first:\n{failed[0]}"
    )


def test_200_generated_fault_schedules_keep_every_promise(tmp_path: Path) -> None:
    _run(range(200), tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(7200)  # about 30 min on two idle cores
def test_10000_generated_fault_schedules_keep_every_promise(tmp_path: Path) -> None:
    _run(range(200, 10_200), tmp_path)


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


def test_resent_claims_on_moving_rows_hand_each_token_out_for_the_url_beside_it(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """Issue 22, defect 2: every schedule gets a claim whose reply is lost after it applied, a NEW
    row landing at a claimed row's position before the resend (so a token sits on two rows), and
    rows moving again before the claim's re-token. The promise checked here: when a claim returns,
    each token it handed out is on one row, beside the URL it was handed out for. With the
    re-token's read-back removed (defect 2 put back), 23 of the 61 seeds of 0-199 that draw
    this step under ``moved=0.25`` broke it, and seeds 1, 5, 6, 7 and 9 of the ten here (0-9,
    the step in every one).

    The same schedules also break two other promises on today's code (open, in
    docs/sheet-queue.md): the resent copy's anchor stays on the re-tokened row (two anchors of
    one token), and a token still on two rows after the re-token stays PROCESSING for
    sheet_reconcile, which the rest phase does not model. They are reported, not asserted, here.
    """
    clients = services(sheets_emulator)
    handed_wrong: list[str] = []
    others = 0
    for seed in range(10):
        sheets_emulator.faults.clear()
        try:
            run_schedule(sheets_emulator, sqlite_ledger, seed, clients=clients, moved=1.0)
        except ScheduleFailed as err:
            first = str(err).split("\n", 1)[0]
            if "claim bound" in first:
                handed_wrong.append(first)
            else:
                others += 1
    print(f"schedules with the open findings (double anchor, token left on two rows): {others} of 10")
    assert not handed_wrong, "\n".join(handed_wrong)


def test_the_parallel_run_reports_a_broken_promise_from_any_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers are forked from this process, so a schedule made to fail here fails there: its
    message comes back, whichever worker played it, and no other seed is reported."""
    from onceflow.testing import sheet_faults

    def fail_on_seven(emulator: object, ledger: object, seed: int, **_: object) -> None:
        if seed == 7:
            raise ScheduleFailed(f"seed {seed}: a promise put out of reach on purpose")

    monkeypatch.setattr(sheet_faults, "run_schedule", fail_on_seven)
    assert run_many(range(10), tmp_path, workers=2) == ["seed 7: a promise put out of reach on purpose"]
    assert run_many(range(10), tmp_path / "one", workers=1) == [
        "seed 7: a promise put out of reach on purpose"
    ]
