"""Side-by-side measurement shared by the benchmarks: warm-up first, alternated order, every repetition.

A benchmark that compares sides (ours against an empty DAG, a batch against one run per item...)
hands :func:`measure_sides` one callable per side. Each side is first run once **untimed** (its
warm-up: the first backfill of a fresh cluster, a cold page cache, a DAG not yet serialised pay
costs the later ones do not), then ``repeat`` timed repetitions run with the order of the sides
**alternated** (A B, B A, A B, ...), so a drift in the machine's load hits both sides alike.
:func:`print_table` prints every repetition with the load average at its start, the medians and
the ratio of medians; nothing is dropped or averaged away.

A side's callable takes the repetition number (0 is the warm-up) and returns a :class:`Result`:
the value compared (seconds, or a rate with ``higher_is_better``) and any detail to print.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def load_average() -> str:
    """The 1/5/15-minute load average, printed beside every figure a benchmark gives."""
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


@dataclass
class Result:
    value: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    side: str
    rep: int  # 0: the warm-up, not counted
    value: float
    load_before: str
    load_after: str
    detail: dict[str, Any]


def order_of(sides: Sequence[str], rep: int) -> list[str]:
    """The sides in the order repetition ``rep`` (1-based) runs them: forward on odd, reversed on even."""
    return list(sides) if rep % 2 == 1 else list(reversed(sides))


def measure_sides(
    sides: Mapping[str, Callable[[int], Result]],
    repeat: int,
    *,
    warmup: bool = True,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> list[Sample]:
    """One untimed warm-up of each side, then ``repeat`` alternated repetitions; every sample returned."""
    samples: list[Sample] = []
    plan = ([(0, side) for side in sides] if warmup else []) + [
        (rep, side) for rep in range(1, repeat + 1) for side in order_of(list(sides), rep)
    ]
    for rep, side in plan:
        before = load_average()
        label = "warm-up (discarded)" if rep == 0 else f"rep {rep}"
        say(f"  {label} {side}: load average {before}")
        result = sides[side](rep)
        after = load_average()
        samples.append(Sample(side, rep, result.value, before, after, result.detail))
        say(f"    {side}: {result.value:.3f}; load average after {after}")
    return samples


def medians(samples: Sequence[Sample]) -> dict[str, float]:
    """Median value per side over the timed repetitions (the warm-up left out)."""
    sides = dict.fromkeys(s.side for s in samples)
    return {
        side: statistics.median(s.value for s in samples if s.side == side and s.rep > 0) for side in sides
    }


def print_table(
    samples: Sequence[Sample],
    *,
    baseline: str,
    unit: str,
    higher_is_better: bool = False,
    fmt: str = "{:.3f}",
    say: Callable[[str], None] = print,
) -> dict[str, float]:
    """Every repetition (warm-up marked), each side's ratio to ``baseline``, medians; returns the medians.

    The ratio is side / baseline for costs and baseline / side for rates (``higher_is_better``),
    so a ratio above 1 always means the side is slower than the baseline.
    """
    sides = list(dict.fromkeys(s.side for s in samples))
    others = [s for s in sides if s != baseline]

    def ratio(value: float, base: float) -> float:
        if higher_is_better:
            return base / value if value else float("inf")
        return value / base if base else float("inf")

    say(f"every repetition, {unit} (ratio > 1: slower than {baseline}); order alternates, load at start")
    header = f"{'rep':>8}" + "".join(f"{s:>16}" for s in sides) + "".join(f"{'x ' + s:>18}" for s in others)
    say(header + "  order, load average 1/5/15 at start of each side")
    for rep in sorted({s.rep for s in samples}):
        mine = {s.side: s for s in samples if s.rep == rep}
        if baseline not in mine:
            continue
        cells = "".join(f"{fmt.format(mine[s].value):>16}" if s in mine else f"{'':>16}" for s in sides)
        ratios = "".join(
            f"{ratio(mine[s].value, mine[baseline].value):>17.2f}x" if s in mine else f"{'':>18}"
            for s in others
        )
        ran = [s.side for s in samples if s.rep == rep]
        loads = ", ".join(f"{s.side} {s.load_before}" for s in samples if s.rep == rep)
        label = "warm-up" if rep == 0 else str(rep)
        say(f"{label:>8}{cells}{ratios}  {' > '.join(ran)}; {loads}")
    med = medians(samples)
    say(
        "median of the timed repetitions: "
        + ", ".join(f"{s} {fmt.format(med[s])}" for s in sides)
        + "".join(f"; {s} / {baseline}: {ratio(med[s], med[baseline]):.2f}x" for s in others)
    )
    return med
