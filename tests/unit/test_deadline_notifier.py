"""MissedDeadlineNotifier, driven through Airflow's own callback runners (triggerer and executor)."""

from __future__ import annotations

import asyncio
from datetime import datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import AsyncCallback

from onceflow.notifications.deadline import (
    MissedDeadlineNotifier,
    append_alert_record,
    build_alert_record,
    daily_load_deadline,
    read_alert_records,
)
from onceflow.notifications.deadline_reference import BusinessTimeDeadline

NOTIFIER_PATH = "onceflow.notifications.deadline.MissedDeadlineNotifier"


def scheduler_context(
    *,
    run_id: str = "scheduled__2026-11-27T23:00:00+00:00",
    run_type: str = "scheduled",
    start: str = "2026-11-27T23:00:00Z",
    end: str = "2026-11-28T23:00:00Z",
    deadline_id: str = "0193a2c4-0000-7000-8000-000000000001",
) -> dict[str, Any]:
    """The context ``Deadline.handle_miss`` builds: a DAGRunResponse JSON dump and the deadline."""
    return {
        "dag_run": {
            "dag_run_id": run_id,
            "dag_id": "daily_sales",
            "logical_date": start,
            "data_interval_start": start,
            "data_interval_end": end,
            "run_type": run_type,
            "state": "running",
        },
        "deadline": {"id": deadline_id, "deadline_time": datetime(2026, 11, 29, 6, 0, tzinfo=timezone.utc)},
    }


def run_in_triggerer(kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the callback exactly as the triggerer does: through airflow's CallbackTrigger."""
    from airflow.triggers.callback import CallbackTrigger

    async def collect() -> list[dict[str, Any]]:
        trigger = CallbackTrigger(callback_path=NOTIFIER_PATH, callback_kwargs=dict(kwargs))
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def test_it_records_a_missed_deadline_when_run_by_the_triggerer(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.jsonl"
    events = run_in_triggerer(
        {
            "alert_name": "daily_sales not loaded by 07:00",
            "path": str(alerts),
            "business_timezone": "Europe/Berlin",
            "due": "07:00",
            "context": scheduler_context(),
        }
    )

    assert [e["state"] for e in events] == ["running", "success"]
    [record] = read_alert_records(alerts)
    assert record["alert"] == "daily_sales not loaded by 07:00"
    assert record["dag_id"] == "daily_sales"
    assert record["run_id"] == "scheduled__2026-11-27T23:00:00+00:00"
    assert record["data_day"] == "2026-11-28"
    assert record["due_local"] == "2026-11-29T07:00:00+01:00"
    assert record["deadline_time"] == "2026-11-29T06:00:00+00:00"
    assert record["suppressed"] is False


def test_it_records_a_missed_deadline_when_run_by_the_executor(tmp_path: Path) -> None:
    from airflow.sdk.execution_time.callback_supervisor import execute_callback

    alerts = tmp_path / "alerts.jsonl"
    ok, error = execute_callback(
        NOTIFIER_PATH,
        {"alert_name": "late", "path": str(alerts), "context": scheduler_context()},
        dag_rel_path=Path("daily_sales.py"),
        bundle_path=None,
        log=_StructlogLike(),
    )

    assert (ok, error) == (True, None)
    assert [r["run_id"] for r in read_alert_records(alerts)] == ["scheduled__2026-11-27T23:00:00+00:00"]


class _StructlogLike:
    """execute_callback logs with structlog-style keyword arguments."""

    def debug(self, *args: Any, **kwargs: Any) -> None: ...

    def info(self, *args: Any, **kwargs: Any) -> None: ...

    def exception(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"callback failed: {kwargs}")


def test_it_writes_one_line_when_the_same_deadline_fires_twice(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.jsonl"
    kwargs = {"alert_name": "late", "path": str(alerts), "context": scheduler_context()}

    run_in_triggerer(kwargs)
    run_in_triggerer(kwargs)

    assert len(read_alert_records(alerts)) == 1
    assert len(alerts.read_text().splitlines()) == 1


def test_it_keeps_one_line_per_distinct_deadline(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.jsonl"
    for n in range(3):
        record = build_alert_record(scheduler_context(deadline_id=f"id-{n}"), alert_name="late")
        assert append_alert_record(alerts, record) is True

    assert [r["deadline_id"] for r in read_alert_records(alerts)] == ["id-0", "id-1", "id-2"]


def test_it_marks_backfill_runs_suppressed(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.jsonl"
    context = scheduler_context(run_id="backfill__2024-03-30T23:00:00+00:00", run_type="backfill")

    run_in_triggerer({"alert_name": "late", "path": str(alerts), "context": context})

    [record] = read_alert_records(alerts)
    assert record["suppressed"] is True
    assert record["run_type"] == "backfill"


@pytest.mark.parametrize(
    ("start", "end", "data_day", "due_local"),
    [
        # Europe/Berlin spring forward on 2026-03-29: a 23-hour day.
        ("2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", "2026-03-29", "2026-03-30T07:00:00+02:00"),
        # Fall back on 2026-10-25: a 25-hour day.
        ("2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", "2026-10-25", "2026-10-26T07:00:00+01:00"),
    ],
)
def test_it_names_the_local_data_day_and_due_time_on_dst_days(
    start: str, end: str, data_day: str, due_local: str
) -> None:
    record = build_alert_record(
        scheduler_context(start=start, end=end),
        alert_name="late",
        business_timezone="Europe/Berlin",
        due="07:00",
    )

    assert (record["data_day"], record["due_local"]) == (data_day, due_local)


def test_it_falls_back_to_airflow_home_when_no_path_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))

    MissedDeadlineNotifier(alert_name="late").notify(scheduler_context())  # type: ignore[arg-type]

    assert len(read_alert_records(tmp_path / "onceflow" / "alerts" / "missed_deadlines.jsonl")) == 1


def test_an_absent_alerts_file_means_no_alerts(tmp_path: Path) -> None:
    assert read_alert_records(tmp_path / "never-written.jsonl") == []


def test_daily_load_deadline_is_due_at_seven_business_time_on_the_next_day() -> None:
    alert = daily_load_deadline(business_timezone="Europe/Berlin", path="/tmp/x.jsonl")

    assert alert.reference == BusinessTimeDeadline(timezone="Europe/Berlin", due="07:00")
    assert alert.interval == timedelta(0)
    assert isinstance(alert.callback, AsyncCallback)
    assert alert.callback.path == NOTIFIER_PATH
    assert alert.callback.kwargs["business_timezone"] == "Europe/Berlin"


def test_daily_load_deadline_honours_a_custom_due_time() -> None:
    alert = daily_load_deadline(business_timezone="UTC", due=time(6, 30))

    assert alert.reference == BusinessTimeDeadline(timezone="UTC", due="06:30")
    assert alert.callback.kwargs["due"] == "06:30"


def test_daily_load_deadline_refuses_an_unknown_timezone() -> None:
    with pytest.raises(Exception, match="Nowhere/Atlantis"):
        daily_load_deadline(business_timezone="Nowhere/Atlantis")


def test_a_dag_with_the_deadline_survives_serialization() -> None:
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG(
        "deadline_serialization_probe",
        schedule=None,
        deadline=daily_load_deadline(business_timezone="Europe/Berlin"),
    ) as dag:
        pass

    serialized = DagSerialization.to_dict(dag)
    restored = DagSerialization.from_dict(serialized)
    assert restored.deadline is not None


def _record(deadline_id: str) -> dict[str, Any]:
    return build_alert_record(scheduler_context(deadline_id=deadline_id), alert_name="late")


def test_a_half_written_last_line_does_not_stop_later_alerts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = tmp_path / "alerts.jsonl"
    assert append_alert_record(alerts, _record("id-0")) is True
    with open(alerts, "a", encoding="utf-8") as fh:
        fh.write('{"alert": "late", "deadline_id": "id-t')  # torn: no closing brace, no newline

    assert append_alert_record(alerts, _record("id-1")) is True
    assert append_alert_record(alerts, _record("id-0")) is False  # dedupe still sees valid lines
    assert append_alert_record(alerts, _record("id-1")) is False

    lines = alerts.read_text().splitlines()
    assert len(lines) == 3  # the new record went onto its own line after the torn one
    assert [r["deadline_id"] for r in read_alert_records(alerts)] == ["id-0", "id-1"]
    assert f"line 2 of alert file {alerts}" in caplog.text


def test_garbage_in_the_middle_is_skipped_by_append_and_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = tmp_path / "alerts.jsonl"
    assert append_alert_record(alerts, _record("id-0")) is True
    with open(alerts, "ab") as fh:
        fh.write(b"\x00\x00\xff\xfe not json\n[1, 2]\n")
    assert append_alert_record(alerts, _record("id-1")) is True
    assert append_alert_record(alerts, _record("id-0")) is False

    assert [r["deadline_id"] for r in read_alert_records(alerts)] == ["id-0", "id-1"]
    assert f"line 2 of alert file {alerts}" in caplog.text
    assert f"line 3 of alert file {alerts}" in caplog.text
