"""NewRowsTrigger: serializes to its classpath and kwargs, and fires from its async loop on NEW rows."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

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
