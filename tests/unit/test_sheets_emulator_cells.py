"""How the Sheets emulator stores input (RAW vs USER_ENTERED) and renders cells; fault rules."""

from __future__ import annotations

import pytest

from onceflow.testing.sheets_emulator.cells import (
    Formula,
    Skip,
    formatted,
    from_json,
    parse_input,
    render,
    to_json,
)
from onceflow.testing.sheets_emulator.faults import Fault, FaultInjector
from onceflow.testing.sheets_emulator.quota import Quota


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("42", 42),
        (" 42 ", 42),
        ("-3.5", -3.5),
        ("1e3", 1000),
        ("true", True),
        ("FALSE", False),
        ("=A1+1", Formula("=A1+1")),
        ("'=A1+1", "=A1+1"),
        ("'42", "42"),
        ("NEW", "NEW"),
        ("  NEW ", "  NEW "),
        ("2024-01-31", "2024-01-31"),
        ("50%", "50%"),
        ("=", "="),
        ("", None),
        (7, 7),
        (2.0, 2),
        (True, True),
    ],
)
def test_user_entered_parses_like_typing_into_a_cell(raw: object, stored: object) -> None:
    value = parse_input(raw, "USER_ENTERED")
    assert value == stored
    assert type(value) is type(stored)


@pytest.mark.parametrize("raw", ["42", "true", "=A1+1", "'x"])
def test_raw_keeps_text_as_text(raw: str) -> None:
    value = parse_input(raw, "RAW")
    assert value == raw
    assert type(value) is str


def test_null_means_skip_and_empty_string_means_empty() -> None:
    assert parse_input(None, "RAW") is Skip
    assert parse_input("", "RAW") is None


def test_render_options() -> None:
    assert [render(c, "FORMATTED_VALUE") for c in (42, 3.5, True, Formula("=1"), None, "x")] == [
        "42",
        "3.5",
        "TRUE",
        "=1",
        "",
        "x",
    ]
    assert [render(c, "UNFORMATTED_VALUE") for c in (42, 3.5, True, Formula("=1"))] == [42, 3.5, True, "=1"]
    assert formatted(1e20) == "1E+20"


def test_formulas_survive_the_state_file_round_trip_distinct_from_text() -> None:
    encoded = [to_json(Formula("=1")), to_json("=1")]
    decoded = [from_json(v) for v in encoded]
    assert encoded == [{"f": "=1"}, "=1"]
    assert type(decoded[0]) is Formula
    assert type(decoded[1]) is str


def test_a_counted_fault_fires_exactly_count_times_for_its_methods() -> None:
    faults = FaultInjector()
    faults.add("429", count=2, methods=["values.get"])

    fired = [
        faults.decide(m).failure is not None
        for m in ["values.update", "values.get", "values.get", "values.get"]
    ]

    assert fired == [False, True, True, False]
    assert faults.rules() == []


def test_the_first_failing_rule_wins_and_latencies_add_up() -> None:
    faults = FaultInjector()
    faults.add("latency", latency=0.5)
    faults.add("500", count=1)
    faults.add("429", count=1)
    faults.add("latency", latency=0.25)

    first, second = faults.decide("values.get"), faults.decide("values.get")

    assert (first.latency, first.failure and first.failure.kind) == (0.75, "500")
    assert (second.latency, second.failure and second.failure.kind) == (0.75, "429")


def test_fault_rules_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        Fault(kind="teapot")
    with pytest.raises(ValueError):
        Fault(kind="500", probability=1.5)
    with pytest.raises(ValueError):
        Fault.from_json({"kind": "500", "cuont": 1})


def test_the_quota_admits_per_window_and_says_how_long_to_wait() -> None:
    now = [100.0]
    quota = Quota(reads_per_minute=2, writes_per_minute=1, window=60.0, clock=lambda: now[0])

    assert [quota.admit(False), quota.admit(False)] == [None, None]
    now[0] = 110.0
    assert quota.admit(False) == 50.0  # the reads of t=100 leave the window at t=160
    assert quota.admit(True) is None  # writes have their own budget
    assert quota.admit(True) == 60.0
    now[0] = 160.0
    assert [quota.admit(False), quota.admit(False), quota.admit(False)] == [None, None, 60.0]
    assert Quota.header(0.2) == "1"
