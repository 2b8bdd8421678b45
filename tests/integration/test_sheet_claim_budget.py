"""The claim's request budget as a ``claim_rows`` task pays it, and the benchmark counting the same.

Each Airflow task is a fresh process with a fresh :class:`~onceflow.sheets.protocol.SheetQueue`.
A wake-up reads the tab's id and its values in one ``spreadsheets.get`` (``ranges`` and a
``fields`` mask with the grid data), then writes one conditional ``batchUpdate``: 1 read + 1
write (it was a ``spreadsheets.get`` for the ids, a ``values.batchGet`` and the ``batchUpdate``);
``benchmarks/bench_sheet_claims.py`` must count exactly what the task sends.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from onceflow.hooks.sheets import SheetQueueHook

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sheet_claims.py"
HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sheet_claims", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_a_claim_task_wakes_up_in_one_read_and_one_write_and_the_benchmark_counts_it(
    sheets_emulator: SheetsEmulator,
) -> None:
    rows = [[f"https://budget.example.com/{i}", "NEW"] for i in range(100)]
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER, *rows]})
    log = sheets_emulator.request_log
    log.reset()
    # what SheetClaimOperator.execute does with the sheet: a hook, its queue, one claim
    claims = SheetQueueHook(spreadsheet_id=sid).queue("v1").claim(10).claims
    assert len(claims) == 10
    assert log.counts == {"spreadsheets.get": 1, "spreadsheets.batchUpdate": 1}
    task = (log.reads, log.writes)
    assert task == (1, 1)

    # the benchmark's wake-up, on the same kind of sheet: the same requests, the get included
    bench = _bench()
    measured = bench.measure(sheets_emulator.server, 100, 10, 2)["protocol"]
    assert measured["claimed"] == 20
    assert (measured["reads_per_claim"] * 10, measured["writes_per_claim"] * 10) == task
    assert measured["claims_per_min"] == 60 / (1 / 10)  # 60 wake-ups a minute, of 10 claims each


def test_a_wake_up_claiming_and_relaying_ten_costs_a_fifth_of_a_write_per_article_in_the_benchmark(
    sheets_emulator: SheetsEmulator,
) -> None:
    """Issue 22's budget: at ten rows claimed and ten write-backs relayed per wake-up, at most 0.2
    reads and 0.2 writes per article, so at least 300 articles/min under 60 writes a minute. The
    wake-up is counted by the emulator as the task sends it (``test_sheet_wakeup.py`` asserts the
    requests one by one); it was 0.3 + 0.3 (200/min) with the relay's own read and batch."""
    bench = _bench()
    reads, writes = bench.wakeup_cost(sheets_emulator.server, 10)
    assert (round(reads, 9), round(writes, 9)) == (0.1, 0.2)
    assert bench.rate(reads, writes) == pytest.approx(300)
    # a relay pass alone (a chain's own write_back) reads the tab once too: no separate tab-id get
    assert tuple(round(x, 9) for x in bench.relay_cost(sheets_emulator.server, 10)) == (0.1, 0.2)
