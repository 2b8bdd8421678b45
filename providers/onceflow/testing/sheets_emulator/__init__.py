"""A Google Sheets API v4 emulator for tests and local runs, driven by the real google-api-python-client.

Run it with ``python -m onceflow.testing.sheets_emulator --port PORT --state FILE`` (or ``onceflow
sheets-emulator``), or in-process::

    with SheetsEmulatorServer(state="state.json") as emulator:
        GSheetsHook(gcp_conn_id="sheets", api_endpoint=emulator.endpoint)

See ``docs/sheets-emulator.md`` for what is implemented and how it differs from Google.
"""

from __future__ import annotations

from onceflow.testing.sheets_emulator.cli import main
from onceflow.testing.sheets_emulator.faults import Fault
from onceflow.testing.sheets_emulator.quota import Quota
from onceflow.testing.sheets_emulator.server import SheetsEmulatorServer

__all__ = ["Fault", "Quota", "SheetsEmulatorServer", "main"]
