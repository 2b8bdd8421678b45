"""benchmarks/sidebyside.py: warm-up first and discarded, sides alternated, every repetition kept."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sidebyside import Result, measure_sides, medians, print_table


def test_each_side_warms_up_once_then_the_order_alternates_and_the_warm_up_is_not_counted() -> None:
    calls: list[tuple[str, int]] = []

    def side(name: str, warm: float, timed: float) -> object:
        def run(rep: int) -> Result:
            calls.append((name, rep))
            return Result(warm if rep == 0 else timed + rep)

        return run

    samples = measure_sides(
        {"empty": side("empty", 100.0, 1.0), "ours": side("ours", 100.0, 2.0)}, 3, say=lambda _: None
    )
    assert calls == [
        ("empty", 0), ("ours", 0),  # the warm-ups, one per side, before any timed repetition
        ("empty", 1), ("ours", 1),
        ("ours", 2), ("empty", 2),  # reversed on even repetitions
        ("empty", 3), ("ours", 3),
    ]  # fmt: skip
    assert len(samples) == 8 and all(s.load_before and s.load_after for s in samples)
    # the warm-ups' 100.0 would move both medians: they are left out
    assert medians(samples) == {"empty": 3.0, "ours": 4.0}


def test_the_table_prints_every_repetition_and_ratios_above_one_mean_slower() -> None:
    def fixed(values: dict[int, float]) -> object:
        return lambda rep: Result(values[rep])

    lines: list[str] = []
    samples = measure_sides(
        {"base": fixed({0: 9.0, 1: 2.0, 2: 2.0}), "rate": fixed({0: 9.0, 1: 1.0, 2: 1.0})},
        2,
        say=lambda _: None,
    )
    med = print_table(samples, baseline="base", unit="per min", higher_is_better=True, say=lines.append)
    assert med == {"base": 2.0, "rate": 1.0}
    rows = [line for line in lines if line.strip().startswith(("warm-up", "1 ", "2 "))]
    assert len(rows) == 3  # the warm-up and both repetitions
    assert "2.00x" in lines[-1]  # half the rate of the baseline: twice as slow
