"""The watchdog's promises over generated fault schedules of real processes
(``onceflow.testing.watchdog_process_faults``): 2-3 ``onceflow-watchdog`` processes SIGKILLed,
SIGSTOPped and restarted, a PostgreSQL ledger cut, frozen (a TCP proxy) or read-only, the alert
receiver process slow, refusing or killed; the promises of ``onceflow.testing.watchdog_faults``
checked on what the receiver recorded. Each schedule takes 40-140 s of wall time (mostly waiting on
periods of seconds and process start-ups; measured at load 17-29 on 2 cores) and about 9 s of CPU,
so all of them are ``slow``; the in-process checker (``test_watchdog_fault_schedules.py``) is the
one in ``make test``. ``ONCEFLOW_WATCHDOG_PROCESS_SEEDS=3,9`` runs chosen seeds.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from onceflow.testing.watchdog_process_faults import generate, replay

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SEEDS = [int(s) for s in os.environ.get("ONCEFLOW_WATCHDOG_PROCESS_SEEDS", "").split(",") if s] or list(
    range(24)
)


def test_schedules_are_seeded_and_cover_every_fault() -> None:
    assert generate(5) == generate(5) and generate(5) != generate(6)
    kinds = {e.kind for s in range(24) for e in generate(s).events}
    assert {
        "kill",
        "stop",
        "restart",
        "ledger_down",
        "ledger_hang",
        "ledger_readonly",
        "receiver_slow",
        "receiver_refuse",
        "receiver_down",
        "receiver_hang",
    } <= kinds
    assert {generate(s).profile for s in range(24)} == {"burst", "mixed", "order"}


@pytest.mark.parametrize("seed", SEEDS)
def test_real_process_fault_schedule_keeps_every_promise(
    seed: int, tmp_path: Path, postgres_url_factory: Callable[..., str]
) -> None:
    outcome = replay(seed, tmp_path, postgres_url_factory("wdfaults"))
    # A RECOVERED counts: a check back before its DOWN could go out (the receiver refusing, as in
    # seed 9) gets one message saying it was down.
    assert any(m["kind"] in ("down", "group", "flapping", "recovery") for m in outcome.messages), (
        "a schedule that pages nothing proves little"
    )
