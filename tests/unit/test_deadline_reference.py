"""BusinessTimeDeadline: 07:00 business time on D+1, also on the 23- and 25-hour days.

The reference goes through Airflow's own serializer and decoder (which find it through the
plugin registry, as the scheduler does) and is evaluated the way the scheduler evaluates it.
The real-scheduler run is ``tests/acceptance/test_deadline_scheduler.py``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

from onceflow.notifications.deadline import daily_load_deadline
from onceflow.notifications.deadline_reference import BusinessTimeDeadline

AMSTERDAM = "Europe/Amsterdam"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


# Amsterdam: spring forward on 2024-03-31 (23 h), fall back on 2024-10-27 (25 h). The run for
# day D starts at D 00:00 local; its deadline is D+1 07:00 local whatever the offset in between.
DST_DAYS = [
    # (logical date = data interval start in UTC, expected deadline in UTC, what it is)
    ("2024-03-29T23:00:00", "2024-03-31T05:00:00", "day before spring forward: due 07:00 CEST"),
    ("2024-03-30T23:00:00", "2024-04-01T05:00:00", "the 23-hour day"),
    ("2024-10-25T22:00:00", "2024-10-27T06:00:00", "day before fall back: due 07:00 CET"),
    ("2024-10-26T22:00:00", "2024-10-28T06:00:00", "the 25-hour day"),
    ("2024-06-14T22:00:00", "2024-06-16T05:00:00", "an ordinary summer day"),
]


@pytest.mark.parametrize(("start", "due", "what"), DST_DAYS, ids=[d[2] for d in DST_DAYS])
def test_the_deadline_is_seven_local_on_the_next_day(start: str, due: str, what: str) -> None:
    reference = daily_load_deadline(business_timezone=AMSTERDAM).reference
    run = SimpleNamespace(logical_date=utc(start))

    deadline = reference._evaluate_with(session=None, dag_run=run)  # type: ignore[attr-defined,arg-type]

    assert deadline == utc(due), what
    assert deadline.astimezone(ZoneInfo(AMSTERDAM)).hour == 7


@pytest.mark.parametrize(("start", "due", "what"), DST_DAYS[1:4:2], ids=["23 h", "25 h"])
def test_a_fixed_utc_interval_is_an_hour_off_on_those_days(start: str, due: str, what: str) -> None:
    """Why the reference exists: logical date + 31 h (the previous alert) misses 07:00 local."""
    assert utc(start) + timedelta(hours=31) != utc(due)
    assert abs(utc(start) + timedelta(hours=31) - utc(due)) == timedelta(hours=1)


def test_it_round_trips_through_airflows_serializer_and_plugin_registry() -> None:
    """What the dag-processor stores and the scheduler decodes (plugin lookup by class path)."""
    from airflow.serialization.decoders import decode_deadline_reference
    from airflow.serialization.encoders import encode_deadline_reference

    reference = BusinessTimeDeadline(timezone=AMSTERDAM, due="07:00")
    encoded = encode_deadline_reference(reference)
    decoded = decode_deadline_reference(encoded)
    run = SimpleNamespace(logical_date=utc("2024-10-26T22:00:00"))

    assert encoded["__class_path"] == "onceflow.notifications.deadline_reference.BusinessTimeDeadline"
    assert decoded.inner_ref == reference
    assert decoded.inner_ref._evaluate_with(session=None, dag_run=run) == utc("2024-10-28T06:00:00")


def test_a_run_without_a_logical_date_gets_no_deadline() -> None:
    run = SimpleNamespace(logical_date=None)

    assert BusinessTimeDeadline(timezone=AMSTERDAM)._evaluate_with(session=None, dag_run=run) is None  # type: ignore[arg-type]


def test_a_bad_timezone_or_due_time_fails_when_the_dag_is_parsed() -> None:
    with pytest.raises(Exception, match="Nowhere/Atlantis"):
        BusinessTimeDeadline(timezone="Nowhere/Atlantis")
    with pytest.raises(ValueError):
        BusinessTimeDeadline(timezone=AMSTERDAM, due="7 o'clock")
