"""Deadline alerts: "the day was not loaded by 07:00 business time", recorded where people look.

Airflow 3.1+ evaluates a DAG's ``deadline=`` in the scheduler. When a run's deadline passes
before the run finishes, the scheduler hands the callback to the triggerer (``AsyncCallback``)
or to the executor (``SyncCallback``); both build the callback with ``context=`` and the kwargs
stored with the DAG, then await or call it. :class:`MissedDeadlineNotifier` is such a callback:
an Airflow notifier that appends one JSON line per missed deadline to a file and logs it.

The line is keyed by the deadline's id and written under an exclusive file lock, so a callback
that runs twice (a triggerer restart re-runs its triggers) still leaves exactly one line.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from airflow.sdk.bases.notifier import BaseNotifier

# ``airflow.sdk.AsyncCallback``, from its module (``airflow/sdk/__init__.pyi`` does not list it for
# type checkers), which differs between 3.1 and 3.2+: hence compat.
from onceflow.compat import AsyncCallback, deadline_alert
from onceflow.notifications.deadline_reference import BusinessTimeDeadline, business_due

if TYPE_CHECKING:
    from airflow.sdk.definitions.context import Context
    from airflow.sdk.definitions.deadline import DeadlineAlert

log = logging.getLogger(__name__)

#: Where alerts go when no ``path`` is given, relative to ``$AIRFLOW_HOME``.
DEFAULT_ALERTS_FILE = Path("onceflow") / "alerts" / "missed_deadlines.jsonl"

#: Run types whose missed deadlines are recorded but marked suppressed: a backfill re-loads
#: days whose 07:00 passed long ago, so every one of its runs "misses" at creation.
DEFAULT_SUPPRESSED_RUN_TYPES: tuple[str, ...] = ("backfill",)


def default_alerts_path() -> Path:
    """``$AIRFLOW_HOME/onceflow/alerts/missed_deadlines.jsonl``, resolved when an alert fires."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / DEFAULT_ALERTS_FILE


def daily_load_deadline(
    *,
    business_timezone: str,
    due: time = time(7, 0),
    alert_name: str = "daily_sales not loaded by 07:00",
    path: str | None = None,
) -> DeadlineAlert:
    """The ``deadline=`` of a daily DAG whose run for day D must finish by ``due`` on D+1, local time.

    The reference is :class:`~onceflow.notifications.deadline_reference.BusinessTimeDeadline`:
    the scheduler computes ``due`` on the day after the run's data day *in the business timezone*
    when it creates the run, so the deadline stays at 07:00 local on the 23- and 25-hour days
    (a fixed ``timedelta`` in UTC would be an hour off there). Needs ``OnceflowPriorityPlugin``
    loaded in the scheduler (the provider's ``airflow.plugins`` entry point does that). The data day
    is the day a run loads (its data interval); a manual run triggered after that day's due time
    gets no deadline (see ``BusinessTimeDeadline.due_for_run``).

    :param business_timezone: IANA name of the business timezone, e.g. ``Europe/Berlin``.
    :param due: local time on the day after the data day by which the load must be finished.
    :param alert_name: a stable name that says what was expected.
    :param path: JSON-lines file for the alert records; default :func:`default_alerts_path`.
    """
    reference = BusinessTimeDeadline(timezone=business_timezone, due=due.strftime("%H:%M"))
    kwargs: dict[str, Any] = {
        "alert_name": alert_name,
        "business_timezone": business_timezone,
        "due": reference.due,
    }
    if path is not None:
        kwargs["path"] = path
    return deadline_alert(
        reference=reference,
        interval=timedelta(0),
        callback=AsyncCallback(MissedDeadlineNotifier, kwargs=kwargs),
        name=alert_name,
    )


class MissedDeadlineNotifier(BaseNotifier):
    """Record a missed deadline as one JSON line and log it.

    Works as a Deadline Alert callback (``AsyncCallback`` in the triggerer, ``SyncCallback`` in the
    executor) and as an ordinary ``on_failure_callback`` notifier.

    :param alert_name: what was expected, e.g. "daily_sales not loaded by 07:00" (templated).
    :param path: the JSON-lines file to append to (templated); default :func:`default_alerts_path`.
    :param business_timezone: IANA timezone used to name the data day and the local due time.
    :param due: ``HH:MM`` local time on the day after the data day; recorded, not evaluated.
    :param suppressed_run_types: run types recorded with ``"suppressed": true`` and logged at
        info level instead of error (backfills by default).
    :param context: set by Airflow when the notifier is built as a deadline callback.
    """

    template_fields: Sequence[str] = ("alert_name", "path")

    def __init__(
        self,
        *,
        alert_name: str,
        path: str | None = None,
        business_timezone: str | None = None,
        due: str | None = None,
        suppressed_run_types: Sequence[str] = DEFAULT_SUPPRESSED_RUN_TYPES,
        context: Context | None = None,
    ) -> None:
        super().__init__(context=context)
        self.alert_name = alert_name
        self.path = path
        self.business_timezone = business_timezone
        self.due = due
        self.suppressed_run_types = tuple(suppressed_run_types)

    async def async_notify(self, context: Context) -> None:
        # File locking and fsync block; keep them off the triggerer's event loop.
        await asyncio.to_thread(self.notify, context)

    def notify(self, context: Context) -> None:
        record = build_alert_record(
            context,
            alert_name=self.alert_name,
            business_timezone=self.business_timezone,
            due=self.due,
            suppressed_run_types=self.suppressed_run_types,
        )
        path = Path(self.path) if self.path else default_alerts_path()
        written = append_alert_record(path, record)
        level = self.log.info if record["suppressed"] else self.log.error
        level(
            "Missed deadline%s%s: %s (dag_id=%s run_id=%s data_day=%s deadline=%s) -> %s",
            " (suppressed)" if record["suppressed"] else "",
            "" if written else " already recorded",
            record["alert"],
            record["dag_id"],
            record["run_id"],
            record["data_day"],
            record["deadline_time"],
            path,
        )


def build_alert_record(
    context: Mapping[str, Any],
    *,
    alert_name: str,
    business_timezone: str | None = None,
    due: str | None = None,
    suppressed_run_types: Sequence[str] = DEFAULT_SUPPRESSED_RUN_TYPES,
) -> dict[str, Any]:
    """The JSON record of one missed deadline, from a deadline callback's (or a task's) context.

    :param context: ``{"dag_run": ..., "deadline": {"id", "deadline_time"}}`` as the scheduler
        builds it (``dag_run`` a JSON dict), or a task context whose ``dag_run`` is an object.
    """
    dag_run = _as_mapping(context.get("dag_run"))
    deadline = _as_mapping(context.get("deadline"))
    run_type = _str_or_none(dag_run.get("run_type"))
    interval_start = _parse_dt(dag_run.get("data_interval_start"))
    interval_end = _parse_dt(dag_run.get("data_interval_end"))
    logical_date = _parse_dt(dag_run.get("logical_date"))
    # The day the deadline was computed from (BusinessTimeDeadline.due_for_run): the day the run
    # loads, its interval start (a manual run's logical date may lie in the next day).
    day_from = interval_start or logical_date
    data_day: date | None = None
    due_local: datetime | None = None
    if business_timezone and day_from is not None:
        tz = ZoneInfo(business_timezone)
        data_day = day_from.astimezone(tz).date()
        if due:
            due_local = business_due(data_day, business_timezone, time.fromisoformat(due)).astimezone(tz)
    deadline_time = _parse_dt(deadline.get("deadline_time"))
    return {
        "alert": alert_name,
        "deadline_id": _str_or_none(deadline.get("id")),
        "deadline_time": _iso(deadline_time),
        "dag_id": dag_run.get("dag_id"),
        "run_id": dag_run.get("dag_run_id") or dag_run.get("run_id"),
        "run_type": run_type,
        "run_state_at_alert": _str_or_none(dag_run.get("state")),
        "logical_date": _iso(logical_date),
        "data_interval_start": _iso(interval_start),
        "data_interval_end": _iso(interval_end),
        "data_day": data_day.isoformat() if data_day else None,
        "due_local": due_local.isoformat() if due_local else None,
        "suppressed": run_type in suppressed_run_types,
        "recorded_at": datetime.now(timezone.utc).isoformat(),
    }


def append_alert_record(path: Path, record: Mapping[str, Any]) -> bool:
    """Append ``record`` as one JSON line unless a line with its ``deadline_id`` exists.

    The check and the append happen under one exclusive ``flock``; the line is written with a
    single ``write`` and fsynced, so readers never see half a record. A line that does not parse
    (torn by a crash or a full disk, or edited by hand) is skipped with a warning; if the file
    does not end with a newline, one is written first so the new record starts its own line.

    :return: True if the line was written, False if it was already there.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    deadline_id = record.get("deadline_id")
    with open(path, "a+", encoding="utf-8", errors="replace") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            size = os.fstat(fh.fileno()).st_size
            ends_with_newline = size == 0 or os.pread(fh.fileno(), 1, size - 1) == b"\n"
            if deadline_id is not None:
                fh.seek(0)
                if any(r.get("deadline_id") == deadline_id for r in _parse_lines(fh, path)):
                    return False
            fh.write(line if ends_with_newline else "\n" + line)
            fh.flush()
            os.fsync(fh.fileno())
            return True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read_alert_records(path: Path | None = None) -> list[dict[str, Any]]:
    """All recorded alerts, oldest first; an absent file means no alert has fired.

    Lines that do not parse as a JSON object are skipped with a warning.
    """
    path = path or default_alerts_path()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return list(_parse_lines(fh, path))
    except FileNotFoundError:
        return []


def _parse_lines(lines: Iterable[str], path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``lines``; blank lines are ignored, unreadable ones logged and skipped."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("Skipping unreadable line %d of alert file %s: %.80r", number, path, line)
            continue
        if not isinstance(record, dict):
            log.warning("Skipping line %d of alert file %s: not a JSON object", number, path)
            continue
        yield record


def _as_mapping(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    # A DagRun object (task-context callbacks): read the same fields as attributes.
    names = (
        "dag_id",
        "run_id",
        "run_type",
        "state",
        "logical_date",
        "data_interval_start",
        "data_interval_end",
        "id",
        "deadline_time",
    )
    return {n: getattr(value, n) for n in names if hasattr(value, n)}


def _parse_dt(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))
