"""A deadline at a wall-clock time in the business timezone: "day D by 07:00 local on D+1".

Airflow's built-in references add a fixed ``timedelta`` in UTC to an instant, so
``DAGRUN_LOGICAL_DATE + 31h`` is 08:00 local after the spring DST change and 06:00 after the
autumn one. :class:`BusinessTimeDeadline` computes the local due time itself, when the scheduler
creates the run: the data day D is the business-local date of the start of the run's data
interval (the day it loads; for a scheduled run also its logical date), the deadline is ``due``
on D+``days_after`` in that zone. A manual run asked for after that time gets none, and so do a
backfill's runs and the days whose due time passed before the DAG was first deployed
(:meth:`BusinessTimeDeadline.due_for_run`): none of them could have been on time, and a
"Missed" row for each in the UI's Deadlines view would bury the real ones.
Use it with ``interval=timedelta(0)``.

Airflow 3.3 evaluates a custom reference only when a plugin lists it in ``deadline_references``
(``OnceflowPriorityPlugin`` does); the scheduler calls :meth:`_evaluate_with` with its own session
and the run's ``dag_id`` and ``run_id`` (``required_kwargs``). Keep this module light: it is
imported wherever plugins load.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from zoneinfo import ZoneInfo

from onceflow.compat import REFERENCE_TYPE_FIELD, BaseDeadlineReference

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def business_due(data_day: dt.date, timezone: str, due: dt.time, days_after: int = 1) -> dt.datetime:
    """``due`` local time on ``data_day + days_after`` in ``timezone``, as an aware UTC datetime."""
    local = dt.datetime.combine(data_day + dt.timedelta(days=days_after), due, tzinfo=ZoneInfo(timezone))
    return local.astimezone(dt.timezone.utc)


def data_day(logical_date: dt.datetime, timezone: str) -> dt.date:
    """The business day a run loads: the local date of its logical date (its interval start)."""
    if logical_date.tzinfo is None:
        logical_date = logical_date.replace(tzinfo=dt.timezone.utc)  # the metadata DB is UTC
    return logical_date.astimezone(ZoneInfo(timezone)).date()


@dataclass(frozen=True)
class BusinessTimeDeadline(BaseDeadlineReference):
    """The due time ``due`` (``HH:MM``) on the day after the run's data day, in ``timezone``.

    Every field has a default because Airflow constructs registered references without arguments.

    :param timezone: IANA name of the business timezone.
    :param due: local wall-clock time ``HH:MM``.
    :param days_after: days between the data day and the due day.
    """

    timezone: str = "UTC"
    due: str = "07:00"
    days_after: int = 1

    #: What the 3.3 scheduler passes to :meth:`_evaluate_with` (it filters its kwargs by this).
    required_kwargs: ClassVar[set[str]] = {"dag_id", "run_id"}

    def __post_init__(self) -> None:
        ZoneInfo(self.timezone)  # a typo fails when the DAG file is parsed, not at 07:00
        dt.time.fromisoformat(self.due)

    def serialize_reference(self) -> dict[str, Any]:
        return {
            REFERENCE_TYPE_FIELD: self.reference_name,
            "timezone": self.timezone,
            "due": self.due,
            "days_after": self.days_after,
        }

    @classmethod
    def deserialize_reference(cls, reference_data: dict[str, Any]) -> BusinessTimeDeadline:
        return cls(
            timezone=reference_data["timezone"],
            due=reference_data["due"],
            days_after=int(reference_data.get("days_after", 1)),
        )

    def fixed_offset(self) -> dt.timedelta:
        """The due time as a fixed offset from the data day's local midnight, in standard time:
        what Airflow 3.1, which evaluates no custom reference, gets instead (``onceflow.compat``)."""
        january = dt.date(2026, 1, 15)
        midnight = dt.datetime.combine(january, dt.time(), tzinfo=ZoneInfo(self.timezone))
        return self.due_for(midnight) - midnight.astimezone(dt.timezone.utc)

    def due_for(self, logical_date: dt.datetime) -> dt.datetime:
        """The deadline of a run whose data day is the local date of ``logical_date``."""
        day = data_day(logical_date, self.timezone)
        return business_due(day, self.timezone, dt.time.fromisoformat(self.due), self.days_after)

    def due_for_run(
        self,
        *,
        logical_date: dt.datetime | None,
        data_interval_start: dt.datetime | None = None,
        run_type: str | None = None,
        run_after: dt.datetime | None = None,
        deployed_at: dt.datetime | None = None,
    ) -> dt.datetime | None:
        """The deadline of one run, or None for no deadline.

        The data day is the day the run **loads**: the local date of its data interval's start
        (for a scheduled or backfill run that is its logical date; a manual run of
        ``CronDataIntervalTimetable`` loads the last whole interval before its logical date or
        trigger time, i.e. the day before). A manual run asked for (``run_after``) at or after
        that day's due time gets no deadline: it re-loads a day whose deadline is over, and an
        alert at creation would only be noise (the scheduled run of that day had its own). A
        scheduled run created late keeps its deadline: the day really is late.

        A **backfill** run gets none: it re-loads a day whose 07:00 has passed, by design. Nor does
        a day whose due time is before ``deployed_at`` (when the DAG was first parsed, its first
        DAG version): the first scheduled run of a fresh deployment after 07:00 loads yesterday,
        which no version of this DAG was there to load on time. After deployment a late scheduled
        run keeps its deadline (a scheduler that was down all night is the case it exists for).
        """
        start = data_interval_start or logical_date
        if start is None:
            return None
        due = self.due_for(start)
        kind = str(getattr(run_type, "value", run_type)) if run_type is not None else None
        if kind == "backfill":
            return None
        if deployed_at is not None and due <= _utc(deployed_at):
            return None
        if kind == "manual" and run_after is not None and _utc(run_after) >= due:
            return None
        return due

    def _evaluate_with(self, *, session: Session, **kwargs: Any) -> dt.datetime | None:
        """Called by the scheduler (core imports stay inside: the SDK side must not need them)."""
        run = kwargs.get("dag_run")  # later Airflow versions hand over the run itself
        if run is None:
            from airflow.models.dagrun import DagRun
            from sqlalchemy import select

            run = session.execute(
                select(
                    DagRun.logical_date, DagRun.data_interval_start, DagRun.run_type, DagRun.run_after
                ).where(DagRun.dag_id == kwargs["dag_id"], DagRun.run_id == kwargs["run_id"])
            ).one_or_none()
            if run is None:
                return None
        return self.due_for_run(
            logical_date=getattr(run, "logical_date", None),
            data_interval_start=getattr(run, "data_interval_start", None),
            run_type=getattr(run, "run_type", None),
            run_after=getattr(run, "run_after", None),
            deployed_at=first_deployed(session, str(kwargs.get("dag_id") or getattr(run, "dag_id", ""))),
        )


def first_deployed(session: Session | None, dag_id: str) -> dt.datetime | None:
    """When ``dag_id`` was first parsed into this metadata DB (its oldest DAG version), or None
    (also without a session: a caller evaluating a run it holds, outside the scheduler)."""
    from airflow.models.dag_version import DagVersion
    from sqlalchemy import func, select

    if session is None or not dag_id:
        return None
    return session.scalar(select(func.min(DagVersion.created_at)).where(DagVersion.dag_id == dag_id))


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)  # DB is UTC
