"""Partition naming and validation for daily partitions.

A partition is one business-local calendar day, written ``YYYY-MM-DD``. Table and partition names
reach SQL as identifiers and BigQuery decorators, so anything that is not a plain identifier or a
plain date is refused here, before it gets near a statement.
"""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

from onceflow.sales.table_names import InvalidNameError, validate_table_name

_PARTITION_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

__all__ = ["InvalidNameError", "validate_table_name"]  # the one table-name validator lives in table_names


def validate_partition(key: str) -> dt.date:
    """Parse a partition key ``YYYY-MM-DD`` into a date, refusing anything else.

    :param key: the partition key, e.g. ``2024-03-31``.
    :raises InvalidNameError: when the key is not exactly a valid ISO date.
    """
    if not isinstance(key, str) or not _PARTITION_RE.fullmatch(key):
        raise InvalidNameError(f"refusing partition {key!r}: expected a date written YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(key)
    except ValueError as err:
        raise InvalidNameError(f"refusing partition {key!r}: {err}") from None


def partition_key(day: dt.date) -> str:
    """The partition key of a business-local day."""
    return day.isoformat()


def bigquery_decorator(table: str, day: dt.date) -> str:
    """``table$YYYYMMDD``: the BigQuery partition decorator that addresses one day partition."""
    return f"{validate_table_name(table)}${day:%Y%m%d}"


def day_bounds_utc(day: dt.date, timezone: str) -> tuple[dt.datetime, dt.datetime]:
    """The half-open UTC interval ``[day 00:00, day+1 00:00)`` of a business-local day.

    The result is 23, 24 or 25 hours long depending on DST; a day starts at
    :func:`local_midnight_utc`.

    :param day: the business-local calendar day.
    :param timezone: IANA name of the business timezone.
    :return: aware UTC datetimes ``(start, end)``.
    """
    tz = ZoneInfo(timezone)
    return local_midnight_utc(day, tz), local_midnight_utc(day + dt.timedelta(days=1), tz)


def local_midnight_utc(day: dt.date, tz: ZoneInfo) -> dt.datetime:
    """When ``day`` starts in ``tz``: the last instant the clock shows ``day`` 00:00, as UTC.

    Where midnight happens twice (America/Havana, 3 November 2024: 01:00 CDT -> 00:00 CST), the
    day starts at the second one, so the repeated hour belongs to the day before; where midnight
    is skipped (Havana, 10 March 2024: 00:00 -> 01:00), at the jump. Both are what Airflow's
    ``CronDataIntervalTimetable`` schedules, so every interval it hands a run is one partition.
    Of the two readings (``fold`` 0 and 1) of local 00:00, that is the later instant.
    """
    naive = dt.datetime.combine(day, dt.time(0))
    readings = (naive.replace(tzinfo=tz, fold=fold).astimezone(dt.timezone.utc) for fold in (0, 1))
    return max(readings)


def partition_for_interval(start: dt.datetime, end: dt.datetime, timezone: str) -> dt.date:
    """The business-local day that the data interval ``[start, end)`` covers exactly.

    Refuses zero-length or multi-day intervals: a run whose interval is not exactly one local day
    (for example a plain cron schedule in Airflow 3, whose intervals have zero length) must not
    load a partition.

    :param start: aware interval start.
    :param end: aware interval end.
    :param timezone: IANA name of the business timezone.
    :raises ValueError: when the interval is not one whole local day.
    """
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("data interval bounds must be timezone-aware")
    day = start.astimezone(ZoneInfo(timezone)).date()
    if (start, end) != day_bounds_utc(day, timezone):
        raise ValueError(
            f"data interval [{start.isoformat()}, {end.isoformat()}) is not one whole day in "
            f"{timezone}; a zero-length interval usually means the DAG uses a plain cron schedule "
            "instead of CronDataIntervalTimetable"
        )
    return day
