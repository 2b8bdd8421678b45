"""The Airflow 3 zero-length-interval trap, and the timetable daily_sales uses instead.

Airflow 3 turns ``schedule="0 0 * * *"`` into ``CronTriggerTimetable`` (``[scheduler]
create_cron_data_intervals`` defaults to False): every run's data interval has zero length, so a
DAG that reads ``[data_interval_start, data_interval_end)`` reads nothing. ``CronDataIntervalTimetable``
gives each run the whole local day before it.
"""

from __future__ import annotations

import datetime as dt

import pendulum
import pytest

AMS = "Europe/Amsterdam"


def _core(timetable: object) -> object:
    from airflow.serialization.encoders import coerce_to_core_timetable

    return coerce_to_core_timetable(timetable)  # type: ignore[arg-type]


def test_a_plain_cron_schedule_gives_zero_length_intervals() -> None:
    from airflow.sdk import DAG
    from airflow.timetables.base import TimeRestriction

    dag = DAG("plain_cron", schedule="0 0 * * *", start_date=pendulum.datetime(2024, 3, 1, tz=AMS))
    assert type(dag.timetable).__name__ == "CronTriggerTimetable"
    core = _core(dag.timetable)
    info = core.next_dagrun_info(  # type: ignore[attr-defined]
        last_automated_data_interval=None,
        restriction=TimeRestriction(
            earliest=pendulum.datetime(2024, 3, 30, tz=AMS), latest=None, catchup=True
        ),
    )
    assert info.data_interval.start == info.data_interval.end
    manual = core.infer_manual_data_interval(run_after=pendulum.datetime(2024, 3, 31, 1, tz=AMS))  # type: ignore[attr-defined]
    assert manual.start == manual.end


@pytest.mark.parametrize(
    ("day", "hours"),
    [(dt.date(2024, 3, 31), 23), (dt.date(2024, 10, 27), 25), (dt.date(2024, 7, 14), 24)],
)
def test_the_data_interval_timetable_gives_whole_local_days(day: dt.date, hours: int) -> None:
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.timetables.base import DataInterval, TimeRestriction

    core = _core(CronDataIntervalTimetable("0 0 * * *", timezone=AMS))
    start = pendulum.datetime(day.year, day.month, day.day, tz=AMS)
    info = core.next_dagrun_info(  # type: ignore[attr-defined]
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=start, latest=None, catchup=True),
    )
    interval: DataInterval = info.data_interval
    assert interval.start == start
    assert interval.end - interval.start == dt.timedelta(hours=hours)
    assert interval.end.in_timezone(AMS).hour == 0
    # The run for day D starts once D is over, at D+1 00:00 local.
    assert info.run_after == interval.end
    # And the next run continues exactly where this one ended (half-open, no gap, no overlap).
    following = core.next_dagrun_info(  # type: ignore[attr-defined]
        last_automated_data_interval=interval,
        restriction=TimeRestriction(earliest=start, latest=None, catchup=True),
    )
    assert following.data_interval.start == interval.end


def test_daily_sales_uses_the_data_interval_timetable() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "dags" / "daily_sales.py"
    spec = importlib.util.spec_from_file_location("daily_sales_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from airflow.sdk import DAG

    dags = [v for v in vars(module).values() if isinstance(v, DAG)]
    dag = dags[0] if dags else module.daily_sales()
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"
    core = _core(dag.timetable)
    manual = core.infer_manual_data_interval(run_after=pendulum.datetime(2024, 10, 28, 0, tz=AMS))  # type: ignore[attr-defined]
    assert (manual.start, manual.end) == (
        pendulum.datetime(2024, 10, 27, tz=AMS),
        pendulum.datetime(2024, 10, 28, tz=AMS),
    )
    load = dag.task_dict["load"]
    assert load.pool == "onceflow_warehouse"
    assert [o.uri for o in load.outlets] == ["x-onceflow://warehouse/daily_sales"]
    assert dag.max_active_runs == 4


def test_a_backfill_date_without_offset_is_utc_and_skips_the_first_local_day() -> None:
    """``airflow backfill create --from-date 2024-01-01`` parses the date in UTC (the default
    timezone): 01:00 in Amsterdam, which aligns to the *next* local midnight. Pass the offset."""
    from airflow._shared.timezones.timezone import parse
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.timetables.base import TimeRestriction

    core = _core(CronDataIntervalTimetable("0 0 * * *", timezone=AMS))

    def first_day(from_date: str) -> dt.date:
        info = core.next_dagrun_info(  # type: ignore[attr-defined]
            last_automated_data_interval=None,
            restriction=TimeRestriction(earliest=parse(from_date), latest=None, catchup=True),
        )
        return info.data_interval.start.in_timezone(AMS).date()

    assert first_day("2024-01-01") == dt.date(2024, 1, 2)
    assert first_day("2024-01-01T00:00:00+01:00") == dt.date(2024, 1, 1)
