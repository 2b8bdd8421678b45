"""NewRowsTrigger: serializes to its classpath and kwargs, and fires from its async loop on NEW rows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets.transport import anonymous_service
from onceflow.triggers.sheets import NewRowsTrigger

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


def test_the_trigger_round_trips_through_serialize() -> None:
    trigger = NewRowsTrigger(spreadsheet_id="sid", sheet="q", min_rows=3, poll_interval=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "onceflow.triggers.sheets.NewRowsTrigger"
    again = NewRowsTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def test_the_trigger_waits_until_enough_rows_are_new_then_fires(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "articles",
        sheets={"queue": [HEADER, ["https://a.example/1", " new"], ["https://a.example/2", "DONE #t"]]},
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    trigger = NewRowsTrigger(min_rows=2, poll_interval=0.2)
    polled = threading.Event()

    def add_row_after_first_polls() -> None:
        polled.wait(30)
        service = anonymous_service(sheets_emulator.endpoint)
        service.spreadsheets().values().append(
            spreadsheetId=sid,
            range="queue",
            valueInputOption="RAW",
            body={"values": [["https://a.example/3", "NEW"]]},
        ).execute()

    async def first_event() -> dict[str, object]:
        runner = trigger.run().__aiter__()
        task = asyncio.ensure_future(runner.__anext__())
        while sheets_emulator.request_log["values.batchGet"] < 2:  # it has looked, and is still waiting
            await asyncio.sleep(0.05)
        assert not task.done()
        polled.set()
        event = await asyncio.wait_for(task, timeout=60)
        return dict(event.payload)

    editor = threading.Thread(target=add_row_after_first_polls)
    editor.start()
    try:
        payload = asyncio.run(first_event())
    finally:
        polled.set()
        editor.join(30)
    assert payload == {"status": "found", "new_rows": 2}


def _first_event(trigger: NewRowsTrigger, timeout: float = 60) -> dict[str, object]:
    async def first() -> dict[str, object]:
        event = await asyncio.wait_for(trigger.run().__aiter__().__anext__(), timeout)
        return dict(event.payload)

    return asyncio.run(first())


def test_a_missing_column_ends_the_wait_at_once_with_an_error_naming_it(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [["link", "status"], ["https://a.example/1", "NEW"]]}
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    payload = _first_event(NewRowsTrigger(poll_interval=0.1))
    assert payload["status"] == "error"
    assert "MissingColumnsError" in str(payload["message"]) and "'url'" in str(payload["message"])
    assert sheets_emulator.request_log["values.batchGet"] == 1, "it stopped instead of polling on"


def test_a_tab_that_does_not_exist_ends_the_wait_with_an_error(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [HEADER]})
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    payload = _first_event(NewRowsTrigger(sheet="no such tab", poll_interval=0.1))
    assert payload["status"] == "error" and "400" in str(payload["message"]), payload


def test_429s_and_500s_do_not_end_the_wait(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, ["https://a.example/1", "NEW"]]}
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    sheets_emulator.faults.add("500", count=2, methods=["values.batchGet"])
    sheets_emulator.faults.add("429", count=1, retry_after=None, methods=["values.batchGet"])
    payload = _first_event(NewRowsTrigger(poll_interval=0.1))
    assert payload == {"status": "found", "new_rows": 1}
    assert sheets_emulator.request_log.snapshot()["faults"] == {"500": 2, "429": 1}


@pytest.mark.slow  # a whole sheet_claim dag.test (~60 s); the trigger tests above run in make test
def test_sheet_claim_fails_loudly_on_a_sheet_missing_a_column_despite_soft_fail(
    run_dag: Any, sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sheet_claim``'s sensor has ``soft_fail`` (nothing new before the timeout: skip). A broken
    sheet is not "nothing new": the run fails, and the task says which column is missing."""
    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [["link", "status"], ["https://a.example/1", "NEW"]]}
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    result = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert result.state == "failed", result.ti_states
    assert result.ti_states["wait_for_new_rows"] == "failed"
    assert result.ti_states["claim_rows"] == "upstream_failed"
    assert sheets_emulator.values(sid, "queue")[1] == ["https://a.example/1", "NEW"], "nothing was touched"


def test_an_idle_wait_ends_at_its_timeout_with_an_event_and_no_error_line(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26 item 7: left to Airflow's deferral timeout, the triggerer cancelled the trigger and
    logged ``ERROR - Trigger cancelled due to timeout`` on every quiet check."""
    import datetime as dt
    import logging

    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, ["https://a.example/1", "DONE #t"]]}
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1.5)).isoformat()
    deadline = time.monotonic() + 1.5  # the same instant on the emulator's clock (CLOCK_MONOTONIC)
    trigger = NewRowsTrigger(min_rows=1, poll_interval=60, timeout_at=soon)  # the poll would be later
    caplog.set_level(logging.INFO)

    payload = _first_event(trigger, timeout=30)

    assert payload == {"status": "timeout", "timeout_at": soon}
    looks = [e.at for e in sheets_emulator.request_log.timeline if e.method == "values.batchGet"]
    # It looked, then once more at the end: the answer comes from a look made at or after the
    # deadline (under load the first look can end after it; it is then not the last), never later.
    assert len(looks) == 2 or (len(looks) == 1 and looks[0] >= deadline), looks
    assert looks[-1] >= deadline - 0.05, (looks, deadline)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert NewRowsTrigger(**trigger.serialize()[1]).timeout_at == soon


def test_a_look_that_ends_after_the_deadline_is_followed_by_one_that_begins_after_it(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow read (here 2.5 s of emulator latency, at load a slow first look did it in CI) began
    before the deadline and ended after it: a row made NEW while it was in flight, before the
    deadline, was not in its answer. The wait must not end on it."""
    import datetime as dt

    sid = sheets_emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, ["https://a.example/1", "DONE #t"]]}
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    sheets_emulator.faults.add("latency", latency=2.5, count=1, methods=["values.batchGet"])
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1.0)).isoformat()
    deadline = time.monotonic() + 1.0
    trigger = NewRowsTrigger(min_rows=1, poll_interval=60, timeout_at=soon)

    payload = _first_event(trigger, timeout=30)

    looks = [e.at for e in sheets_emulator.request_log.timeline if e.method == "values.batchGet"]
    assert looks[0] < deadline, "the slow look did not begin before the deadline: nothing tested"
    assert payload == {"status": "timeout", "timeout_at": soon}
    assert len(looks) == 2 and looks[-1] >= deadline, (looks, deadline)


def test_the_sensor_skips_on_the_triggers_timeout_with_soft_fail() -> None:
    from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

    from onceflow.sensors.sheets import NewRowsSensor

    event = {"status": "timeout", "timeout_at": "2026-12-02T10:00:00+00:00"}
    strict = NewRowsSensor(task_id="wait", timeout=300)
    with pytest.raises(AirflowSensorTimeout, match="no 1 NEW rows before 2026-12-02T10:00"):
        strict.resume_execution("execute_complete", {"event": event}, {})
    lenient = NewRowsSensor(task_id="wait", timeout=300, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        lenient.resume_execution("execute_complete", {"event": event}, {})


def _waiting_verdict(sheets_emulator: SheetsEmulator, ledger: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A tab with no NEW row and one row whose INVALID waits in the ledger's outbox (its claimer
    died between the commit and the relay); the connections point at both."""
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import claim_work_key, decided_write

    token = "20261203T080000Z-0123456789-v1"
    sid = sheets_emulator.create_spreadsheet(
        "articles",
        sheets={"queue": [HEADER, ["", f"PROCESSING #{token}"], ["https://a.example/1", "DONE #t"]]},
    )
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_SHEETS", sheets_emulator.connection_json(spreadsheet_id=sid))
    url = ledger.engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": url}})
    )
    write = decided_write(f"{sid}/queue", token, Status.INVALID, "empty URL", url="", row_key=None)
    ledger.enqueue("sheet_claim", [(claim_work_key(token), write)])
    return sid


def test_a_write_back_waiting_in_the_outbox_fires_the_trigger_without_a_new_row_or_a_sheet_read(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: ``sheet_claim`` relayed the outbox only when its sensor saw NEW rows, so a
    write-back left pending (its chain's relay failed, a claimer died after its commit) waited for
    the next NEW row. The trigger asks the ledger first (one query, no Sheets request)."""
    import datetime as dt

    _waiting_verdict(sheets_emulator, sqlite_ledger, monkeypatch)
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)).isoformat()
    asks = NewRowsTrigger(poll_interval=60, timeout_at=soon, ledger_conn_id="onceflow_ledger")
    assert _first_event(asks, timeout=30) == {"status": "found", "new_rows": 0, "pending_writes": 1}
    assert sheets_emulator.request_log.counts == {}, "the sheet was not read"
    # without the ledger it waits for a NEW row that never comes
    blind = NewRowsTrigger(poll_interval=60, timeout_at=soon)
    assert _first_event(blind, timeout=30)["status"] == "timeout"
    assert NewRowsTrigger(**asks.serialize()[1]).ledger_conn_id == "onceflow_ledger"


@pytest.mark.slow  # a whole sheet_claim dag.test (~60 s)
def test_sheet_claim_wakes_up_for_a_write_back_waiting_in_the_outbox_and_writes_it(
    run_dag: Any, sheets_emulator: SheetsEmulator, sqlite_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow.ledger.outbox import pending_sheet_rows

    sid = _waiting_verdict(sheets_emulator, sqlite_ledger, monkeypatch)
    result = run_dag("sheet_claim", conf={"max_rows": 10, "processing_version": "v1"})
    assert result.state == "success", result.ti_states
    assert result.ti_states == {"wait_for_new_rows": "success", "claim_rows": "success"}
    row = sheets_emulator.values(sid, "queue")[1]
    assert row[:3] == ["", "INVALID #20261203T080000Z-0123456789-v1", "empty URL"]
    assert pending_sheet_rows(sqlite_ledger) == []
