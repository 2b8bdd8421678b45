"""daily_sales' deadline as Airflow evaluates it, on the days around both DST changes.

The alert's reference goes through Airflow's own encoder and decoder (the decoder finds a custom
reference through the plugin registry, as the scheduler does) and is evaluated with
``evaluate_with`` against real ``dag_run`` rows in the session's metadata DB, plus the alert's
interval: the same calls the scheduler makes when it creates a run. Every deadline must be 07:00
Amsterdam time on the day after the data day. (``DAGRUN_LOGICAL_DATE + 31 h``, the alert before
issue 12, gives 08:00 after the spring change and 06:00 after the autumn one.) The real scheduler
does the same in ``tests/acceptance/test_deadline_scheduler.py``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

import pytest

TZ = "Europe/Amsterdam"
# Data days next to and on the 2024 changes: 31 March has 23 hours, 27 October 25.
DAYS = [dt.date(2024, 3, 30), dt.date(2024, 3, 31), dt.date(2024, 10, 26), dt.date(2024, 10, 27)]


def local_midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0), tzinfo=ZoneInfo(TZ)).astimezone(dt.timezone.utc)


@pytest.mark.parametrize("day", DAYS, ids=[d.isoformat() for d in DAYS])
def test_airflow_evaluates_the_deadline_to_seven_local_on_the_next_day(
    airflow_db: object, day: dt.date
) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.serialization.decoders import decode_deadline_reference
    from airflow.serialization.encoders import encode_deadline_reference
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    from onceflow.notifications.deadline import daily_load_deadline

    alert = daily_load_deadline(business_timezone=TZ)
    start, end = local_midnight(day), local_midnight(day + dt.timedelta(days=1))
    # not the acceptance test's deadline_dst_probe: both write dag_run rows to the session's DB
    dag_id, run_id = "deadline_dst_reference", f"scheduled__{start.isoformat()}"
    with create_session() as session:
        session.add(
            DagRun(
                dag_id=dag_id,
                run_id=run_id,
                logical_date=start,
                data_interval=(start, end),
                run_after=end,
                run_type=DagRunType.SCHEDULED,
            )
        )
        session.flush()
        reference = decode_deadline_reference(encode_deadline_reference(alert.reference))
        deadline = reference.evaluate_with(
            session=session, interval=alert.interval, dag_id=dag_id, run_id=run_id
        )
        session.rollback()

    due = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(7), tzinfo=ZoneInfo(TZ))
    assert deadline is not None
    assert deadline.astimezone(ZoneInfo(TZ)) == due, (
        f"{deadline} is {deadline.astimezone(ZoneInfo(TZ))} local"
    )


def manual_run_deadline(logical_local: dt.datetime, run_after_local: dt.datetime, run_id: str) -> Any:
    """Create a manual run as the REST API does for daily_sales' timetable; evaluate its deadline
    as the scheduler does. Returns (loaded day, deadline or None)."""
    from airflow.models.dagrun import DagRun
    from airflow.serialization.decoders import decode_deadline_reference
    from airflow.serialization.encoders import encode_deadline_reference
    from airflow.timetables.interval import CronDataIntervalTimetable
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType
    from pendulum import instance

    from onceflow.notifications.deadline import daily_load_deadline
    from onceflow.sales.partitions import partition_for_interval

    alert = daily_load_deadline(business_timezone=TZ)
    logical = logical_local.astimezone(dt.timezone.utc)
    # What TriggerDAGRunPostBody does for a DAG with daily_sales' timetable.
    interval = CronDataIntervalTimetable("0 0 * * *", timezone=TZ).infer_manual_data_interval(
        run_after=instance(logical)
    )
    loaded = partition_for_interval(interval.start, interval.end, TZ)
    with create_session() as session:
        session.add(
            DagRun(
                dag_id="deadline_manual_probe",
                run_id=run_id,
                logical_date=logical,
                data_interval=(interval.start, interval.end),
                run_after=run_after_local.astimezone(dt.timezone.utc),
                run_type=DagRunType.MANUAL,
            )
        )
        session.flush()
        reference = decode_deadline_reference(encode_deadline_reference(alert.reference))
        deadline = reference.evaluate_with(
            session=session, interval=alert.interval, dag_id="deadline_manual_probe", run_id=run_id
        )
        session.rollback()
    return loaded, deadline


def test_a_manual_run_is_due_the_day_after_the_day_it_loads(airflow_db: object) -> None:
    """Triggered at 05:30 on 30 March (the night's load failed): it loads 29 March, so it is due
    at 07:00 on 30 March, not on 31 March (the day after its logical date)."""
    at = dt.datetime(2024, 3, 30, 5, 30, tzinfo=ZoneInfo(TZ))
    loaded, deadline = manual_run_deadline(at, at, "manual__early")

    assert loaded == dt.date(2024, 3, 29)
    assert deadline is not None
    assert deadline.astimezone(ZoneInfo(TZ)) == dt.datetime(2024, 3, 30, 7, tzinfo=ZoneInfo(TZ))


def test_a_manual_run_asked_for_after_its_days_due_time_gets_no_deadline(airflow_db: object) -> None:
    """A re-run of an old day (logical date 30 March 23:30, so it loads 29 March) triggered on
    2 April: its 07:00 is long past, and an alert at creation would be noise."""
    logical = dt.datetime(2024, 3, 30, 23, 30, tzinfo=ZoneInfo(TZ))
    loaded, deadline = manual_run_deadline(
        logical, dt.datetime(2024, 4, 2, 10, tzinfo=ZoneInfo(TZ)), "manual__late"
    )

    assert loaded == dt.date(2024, 3, 29)
    assert deadline is None


def _scheduled_or_backfill_deadline(
    dag_id: str, day: dt.date, run_type: str, deployed_at: dt.datetime | None
) -> Any:
    """A run of ``day`` as the scheduler or a backfill creates it, in a DAG first parsed at
    ``deployed_at`` (its first DAG version); its deadline evaluated as the scheduler does."""
    from airflow.models.dag import DagModel
    from airflow.models.dag_version import DagVersion
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.serialization.decoders import decode_deadline_reference
    from airflow.serialization.encoders import encode_deadline_reference
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    from onceflow.notifications.deadline import daily_load_deadline

    alert = daily_load_deadline(business_timezone=TZ)
    start, end = local_midnight(day), local_midnight(day + dt.timedelta(days=1))
    run_id = f"{run_type}__{start.isoformat()}"
    with create_session() as session:
        if deployed_at is not None:
            session.merge(DagBundleModel(name="deadline-probes"))
            session.flush()
            session.add(DagModel(dag_id=dag_id, bundle_name="deadline-probes"))
            session.flush()
            session.add(DagVersion(dag_id=dag_id, version_number=1, created_at=deployed_at))
        session.add(
            DagRun(
                dag_id=dag_id,
                run_id=run_id,
                logical_date=start,
                data_interval=(start, end),
                run_after=end,
                run_type=DagRunType(run_type),
            )
        )
        session.flush()
        reference = decode_deadline_reference(encode_deadline_reference(alert.reference))
        deadline = reference.evaluate_with(
            session=session, interval=alert.interval, dag_id=dag_id, run_id=run_id
        )
        session.rollback()
    return deadline


def test_a_backfill_run_gets_no_deadline(airflow_db: object) -> None:
    """Each backfilled day's 07:00 passed before it ran: a "Missed" row per day would be noise."""
    assert (
        _scheduled_or_backfill_deadline("deadline_backfill_probe", dt.date(2024, 3, 29), "backfill", None)
        is None
    )


def test_a_day_due_before_the_dag_was_first_deployed_gets_no_deadline(airflow_db: object) -> None:
    """A fresh deployment at 09:00 on 2 April: its first scheduled run loads 1 April, due 07:00
    that morning, before the DAG existed. The next day's run keeps its deadline."""
    deployed = dt.datetime(2024, 4, 2, 9, tzinfo=ZoneInfo(TZ)).astimezone(dt.timezone.utc)
    before = _scheduled_or_backfill_deadline(
        "deadline_deploy_probe", dt.date(2024, 4, 1), "scheduled", deployed
    )
    after = _scheduled_or_backfill_deadline(
        "deadline_deploy_probe", dt.date(2024, 4, 2), "scheduled", deployed
    )

    assert before is None
    assert after is not None
    assert after.astimezone(ZoneInfo(TZ)) == dt.datetime(2024, 4, 3, 7, tzinfo=ZoneInfo(TZ))
