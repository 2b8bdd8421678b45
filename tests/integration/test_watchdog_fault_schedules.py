"""The watchdog's promises over generated fault schedules (``onceflow.testing.watchdog_faults``).

100 schedules here, thousands in ``make test-slow``; a failing one names its seed, and
``replay(seed, tmp_path)`` runs exactly that schedule again. Each schedule is real SQLite files, a
real HTTP receiver and in-process replicas on one fake clock (see the module's docstring for the
faults and the six promises).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import pytest

from onceflow.testing.watchdog_faults import (
    Outcome,
    check_promises,
    generate,
    replay_many,
    run_schedule,
    status_problems,
)

if TYPE_CHECKING:
    from pathlib import Path

FAST = int(os.environ.get("ONCEFLOW_WATCHDOG_SCHEDULES", "100"))


def _run_many(seeds: range, tmp_path: Path) -> None:
    failures = replay_many(seeds, tmp_path)
    assert not failures, "\n\n".join(failures)


def test_generated_fault_schedules_keep_every_promise(tmp_path: Path) -> None:
    _run_many(range(FAST), tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(5400)  # 2,000 schedules: about 30 min on two idle cores
def test_thousands_of_generated_fault_schedules_keep_every_promise(tmp_path: Path) -> None:
    _run_many(range(10_000, 12_000), tmp_path)


def test_a_seed_is_a_schedule_and_replays_to_the_same_messages(tmp_path: Path) -> None:
    assert generate(41) == generate(41) and generate(41) != generate(42)
    # Replicas one after another: the messages replay exactly (with threads, the schedule does).
    seed = next(s for s in range(41, 200) if not generate(s).concurrent and generate(s).replicas > 1)
    first = run_schedule(generate(seed), tmp_path / "a")
    again = run_schedule(generate(seed), tmp_path / "b")

    def strip(o: Outcome) -> list[tuple[str, float]]:
        # A blindness key carries its state file's random id: equal up to that.
        return [(re.sub(r"/[0-9a-f]{12}\.", "/<file>.", m["key"]), m["t"]) for m in o.messages]

    assert strip(first) == strip(again)
    assert any(m["kind"] == "down" for m in first.messages), "a schedule that pages nothing proves little"


def test_each_promise_check_can_fail(tmp_path: Path) -> None:
    """The checks are not vacuous: outcomes that break each promise are reported."""
    base = run_schedule(generate(41), tmp_path / "base")
    assert check_promises(base) == []
    down = next(m for m in base.messages if m["kind"] == "down")

    def broken(**changes: object) -> list[str]:
        return check_promises(Outcome(**{**base.__dict__, **changes}))

    # a repeat without a crash
    assert any("without a crash" in p for p in broken(messages=[*base.messages, down]))
    # two keys for one incident's down
    assert any(
        "keys for one down" in p for p in broken(messages=[*base.messages, {**down, "key": "x/1/down/y"}])
    )
    # the incident is over but the last word is DOWN
    assert any(
        "last message is down" in p for p in broken(messages=[*base.messages, {**down, "key": down["key"]}])
    )
    # nothing paged for a long silence
    silent = [(base.schedule.checks[0], 0.0, 10_000.0)]
    assert any("no page" in p for p in broken(messages=[], silences=silent))
    # a repeat of the crash window, but in a group under another key: no receiver can drop it
    facts = {k: v for k, v in down.items() if k not in ("key", "t")}
    regrouped = {"key": f"{down['key']}+1", "t": down["t"] + 1, "kind": "group", "alerts": [facts]}
    assert any(
        "under another Idempotency-Key" in p
        for p in broken(messages=[*base.messages, regrouped], crashed_keys={down["key"]})
    )
    # a check's next incident arriving before the last word of the one before
    later, recovery = next(
        (b, a)
        for a in base.messages
        for b in base.messages
        if a["kind"] == "recovery"
        and b["check"] == a["check"] == base.schedule.checks[1]
        and b["incident"] > a["incident"]
    )
    swapped = [m for m in base.messages if m["key"] != recovery["key"]]
    swapped.insert(swapped.index(later) + 1, recovery)
    assert any(f"{recovery['key']} arrived after {later['key']}" in p for p in broken(messages=swapped))
    # a blindness incident left DOWN
    blind = {"key": "watchdog.blind.ledger/0123456789ab.1/down/webhook", "t": 5.0}
    blind |= {"check": "watchdog.blind.ledger", "kind": "down", "incident": 1, "state": "down"}
    assert any("last message is down" in p for p in broken(messages=[*base.messages, blind]))
    # a settled replica's status still blind, or a check's last beat another DAG's
    report = {"ledger": {"readable": True}, "blind": {"watchdog.blind.pass": {}}, "checks": {}}
    report["checks"] = {"c0": {"last_beat": 20.0}}
    problems = status_problems(report, (True, "ok"), {"c0": 10.0, "c1": 20.0})
    assert any("still blind" in p for p in problems) and any("not its DAG's newest" in p for p in problems)
    assert any(
        "/health" in p for p in status_problems({**report, "blind": {}}, (False, "stuck"), {"c0": 20.0})
    )
