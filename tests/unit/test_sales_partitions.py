"""Partition naming, interval bounds and the zero-length-interval trap."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from onceflow.sales.partitions import (
    InvalidNameError,
    bigquery_decorator,
    day_bounds_utc,
    partition_for_interval,
    validate_partition,
    validate_table_name,
)
from onceflow.sales.schema import sales_table

UTC = dt.timezone.utc
AMS = "Europe/Amsterdam"


@pytest.mark.parametrize(
    "name",
    [
        "daily_sales; DROP TABLE load_audit",
        "daily_sales--",
        "daily_sales' OR '1'='1",
        'x"; DELETE FROM orders; --',
        "a.b.c",
        "1sales",
        "",
        "sales table",
        "sales$20240101",
        "x" * 64,
    ],
)
def test_it_refuses_injection_shaped_table_names(name: str) -> None:
    with pytest.raises(InvalidNameError, match="refusing table name"):
        validate_table_name(name)


def test_it_refuses_injection_shaped_names_before_building_a_table() -> None:
    import sqlalchemy as sa

    with pytest.raises(InvalidNameError):
        sales_table("sales;drop table x", sa.MetaData())


@pytest.mark.parametrize("name", ["daily_sales", "analytics.daily_sales", "_t1"])
def test_it_accepts_plain_identifiers(name: str) -> None:
    assert validate_table_name(name) == name


@pytest.mark.parametrize(
    "key",
    ["2024-1-01", "2024-02-30", "2024-01-01'; DROP TABLE x; --", "20240101", "2024-01-01 ", "../2024-01-01"],
)
def test_it_refuses_partitions_that_are_not_plain_dates(key: str) -> None:
    with pytest.raises(InvalidNameError, match="refusing partition"):
        validate_partition(key)


def test_it_parses_a_valid_partition() -> None:
    assert validate_partition("2024-02-29") == dt.date(2024, 2, 29)


def test_bigquery_decorator_addresses_one_day() -> None:
    assert bigquery_decorator("daily_sales", dt.date(2024, 3, 31)) == "daily_sales$20240331"
    with pytest.raises(InvalidNameError):
        bigquery_decorator("daily_sales$2024", dt.date(2024, 3, 31))


@pytest.mark.parametrize(
    ("day", "hours"),
    [(dt.date(2024, 3, 31), 23), (dt.date(2024, 10, 27), 25), (dt.date(2024, 6, 1), 24)],
)
def test_local_days_are_23_24_or_25_hours_long(day: dt.date, hours: int) -> None:
    start, end = day_bounds_utc(day, AMS)
    assert end - start == dt.timedelta(hours=hours)
    local = ZoneInfo(AMS)
    assert (start.astimezone(local).date(), start.astimezone(local).time()) == (day, dt.time(0))
    assert end.astimezone(local).time() == dt.time(0)


def test_interval_bounds_are_local_midnights_in_utc() -> None:
    assert day_bounds_utc(dt.date(2024, 10, 27), AMS) == (
        dt.datetime(2024, 10, 26, 22, tzinfo=UTC),
        dt.datetime(2024, 10, 27, 23, tzinfo=UTC),
    )


def test_a_whole_local_day_maps_to_its_partition() -> None:
    start, end = day_bounds_utc(dt.date(2024, 3, 31), AMS)
    assert partition_for_interval(start, end, AMS) == dt.date(2024, 3, 31)


def test_a_zero_length_interval_is_refused() -> None:
    """What a plain cron schedule gives in Airflow 3: start == end. Loading it would be wrong."""
    instant = dt.datetime(2024, 3, 30, 23, tzinfo=UTC)
    with pytest.raises(ValueError, match="zero-length interval"):
        partition_for_interval(instant, instant, AMS)


def test_an_interval_in_the_wrong_timezone_is_refused() -> None:
    # A UTC day is not an Amsterdam day.
    with pytest.raises(ValueError, match="not one whole day"):
        partition_for_interval(dt.datetime(2024, 6, 1, tzinfo=UTC), dt.datetime(2024, 6, 2, tzinfo=UTC), AMS)


@pytest.mark.parametrize(
    ("tz", "first"),
    [
        ("America/Havana", dt.date(2024, 11, 1)),  # 01:00 CDT -> 00:00 CST: 00:00-01:00 twice
        ("America/Havana", dt.date(2024, 3, 8)),  # 00:00 CST -> 01:00 CDT: midnight skipped
        ("America/Santiago", dt.date(2024, 9, 6)),  # midnight skipped
        ("America/Santiago", dt.date(2024, 4, 5)),  # 23:00-24:00 twice
        (AMS, dt.date(2024, 10, 25)),
    ],
)
def test_every_interval_airflow_schedules_around_an_odd_midnight_is_a_partition(
    tz: str, first: dt.date
) -> None:
    """The repeated hour 00:00-01:00 of a repeated midnight belongs to the day before, as in
    Airflow's own timetable; partition_for_interval and day_bounds_utc agree with every interval."""
    import pendulum
    from airflow.timetables.base import TimeRestriction
    from airflow.timetables.interval import CronDataIntervalTimetable

    timetable = CronDataIntervalTimetable("0 0 * * *", timezone=tz)
    earliest = pendulum.datetime(first.year, first.month, first.day, tz=tz)
    restriction = TimeRestriction(earliest=earliest, latest=None, catchup=True)
    last, days = None, []
    for _ in range(4):
        info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
        assert info is not None
        last = interval = info.data_interval
        assert interval is not None
        days.append(partition_for_interval(interval.start, interval.end, tz))
        assert day_bounds_utc(days[-1], tz) == (interval.start, interval.end)

    assert days == [first + dt.timedelta(days=n) for n in range(4)]
