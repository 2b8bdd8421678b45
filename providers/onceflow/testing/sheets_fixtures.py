"""The Sheets API emulator behind the plugin's fixtures (``onceflow.testing.pytest_plugin`` declares
them and imports this module when one is used).

``onceflow_sheets_emulator`` starts a fresh emulator per test on a free 127.0.0.1 port (in a thread of the
test process, state in ``tmp_path``) and sets the ``onceflow_sheets`` Airflow connection to reach it
anonymously, so ``GSheetsHook(gcp_conn_id="onceflow_sheets", api_endpoint=onceflow_sheets_emulator.endpoint)``
talks to it through the real google-api-python-client::

    def test_it_reads_the_queue(onceflow_sheets_emulator):
        sid = onceflow_sheets_emulator.create_spreadsheet("q", sheets={"Queue": [["url", "status"], ["u", "NEW"]]})
        hook = onceflow_sheets_emulator.hook()
        assert hook.get_values(sid, "Queue!A:B") == [["url", "status"], ["u", "NEW"]]
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    import pytest

    from onceflow.testing.sheets_emulator.faults import FaultInjector
    from onceflow.testing.sheets_emulator.quota import Quota
    from onceflow.testing.sheets_emulator.requestlog import RequestLog

DEFAULT_CONN_ID = "onceflow_sheets"
#: the article queue's columns with the claim's own two (``docs/sheet-queue.md``)
CLAIMED_QUEUE_HEADER = [
    "url",
    "status",
    "reason",
    "run_id",
    "score",
    "published_url",
    "claim_token",
    "claimed_at",
]


def connection_json(endpoint: str, **extra: Any) -> str:
    """The ``AIRFLOW_CONN_*`` value of an anonymous ``google_cloud_platform`` connection to an emulator.

    ``api_endpoint`` in the extra is for hooks that read their endpoint from the connection;
    Airflow's own ``GSheetsHook`` ignores it and takes ``api_endpoint=`` as an argument.

    :param endpoint: the emulator's base URL.
    :param extra: more connection extras (``num_retries``, ...).
    """
    return json.dumps(
        {
            "conn_type": "google_cloud_platform",
            "extra": {"is_anonymous": True, "api_endpoint": endpoint, **extra},
        }
    )


class SheetsEmulator:
    """A running emulator plus helpers to seed it, inspect it and break it.

    :param state: the JSON state file (kept across :meth:`restart`); ``None`` keeps state in memory.
    :param port: port to bind, 0 for any free port.
    """

    def __init__(self, state: str | Path | None, port: int = 0) -> None:
        from onceflow.testing.sheets_emulator.server import SheetsEmulatorServer

        self.state = state
        self.server = SheetsEmulatorServer(port=port, state=state).start()

    @property
    def endpoint(self) -> str:
        """Base URL for ``api_endpoint``: ``http://127.0.0.1:PORT/``."""
        return self.server.endpoint

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def request_log(self) -> RequestLog:
        """Calls per method: ``.counts``, ``.reads``, ``.writes``, ``.total``, ``["values.get"]``,
        ``.reset()``."""
        return self.server.request_log

    @property
    def faults(self) -> FaultInjector:
        """Fault control: ``.add("429", count=2, retry_after=1)``, ``.add("apply_then_fail", count=1)``,
        ``.clear()``."""
        return self.server.faults

    def set_quota(
        self, reads_per_minute: int | None = 60, writes_per_minute: int | None = 60, window: float = 60.0
    ) -> Quota:
        """Enforce Google-like per-window request quotas (429 + Retry-After past them).

        :param reads_per_minute: reads admitted per window, ``None`` for no limit.
        :param writes_per_minute: writes admitted per window, ``None`` for no limit.
        :param window: window length in seconds (shorten it in tests).
        """
        from onceflow.testing.sheets_emulator.quota import Quota

        self.server.quota = Quota(reads_per_minute, writes_per_minute, window)
        return self.server.quota

    def clear_quota(self) -> None:
        self.server.quota = None

    def set_metadata_limit(self, characters: int | None) -> None:
        """Developer metadata cap per spreadsheet and per sheet (Google's 30,000 by default; ``None``
        turns it off)."""
        self.server.store.metadata_limit = characters

    def create_spreadsheet(
        self,
        title: str = "Untitled spreadsheet",
        sheets: dict[str, list[list[Any]]] | None = None,
        *,
        spreadsheet_id: str | None = None,
        value_input_option: str = "RAW",
    ) -> str:
        """Create a spreadsheet with data (not counted in the request log) and return its id.

        :param title: spreadsheet title.
        :param sheets: sheet title -> rows, in tab order; default one empty ``Sheet1``.
        :param spreadsheet_id: fixed id instead of a random one.
        :param value_input_option: how the rows are entered, RAW (default) or USER_ENTERED.
        """
        spec: dict[str, Any] = {"title": title, "valueInputOption": value_input_option}
        if sheets is not None:
            spec["sheets"] = sheets
        if spreadsheet_id is not None:
            spec["spreadsheetId"] = spreadsheet_id
        return str(self.server.seed(spec)["spreadsheetId"])

    def values(self, spreadsheet_id: str, range_: str) -> list[list[Any]]:
        """Cells of ``range_`` straight from the state (formulas as their text, trailing empties trimmed)."""
        return self.server.raw_values(spreadsheet_id, range_)

    def connection_json(self, **extra: Any) -> str:
        """See :func:`connection_json`."""
        return connection_json(self.endpoint, **extra)

    def hook(self, conn_id: str = DEFAULT_CONN_ID) -> Any:
        """A ``GSheetsHook`` on this emulator.

        :param conn_id: an existing connection; the fixture sets ``onceflow_sheets``.
        """
        from airflow.providers.google.suite.hooks.sheets import GSheetsHook

        return GSheetsHook(gcp_conn_id=conn_id, api_endpoint=self.endpoint)

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """Stop, then start a new server on the same port from the same state file."""
        from onceflow.testing.sheets_emulator.server import SheetsEmulatorServer

        port, limit = self.server.port, self.server.store.metadata_limit
        self.server.stop()
        self.server = SheetsEmulatorServer(port=port, state=self.state, metadata_limit=limit).start()


def emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SheetsEmulator]:
    """``onceflow_sheets_emulator``: a fresh emulator, ``AIRFLOW_CONN_ONCEFLOW_SHEETS`` pointing at it."""
    made = SheetsEmulator(tmp_path / "sheets-state.json")
    monkeypatch.setenv(f"AIRFLOW_CONN_{DEFAULT_CONN_ID.upper()}", made.connection_json())
    try:
        yield made
    finally:
        made.stop()


def queue_sheet(
    sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[list[str]]], str]:
    """``onceflow_queue_sheet``: ``make(rows)`` -> the id of a queue spreadsheet (tab ``queue``,
    :data:`CLAIMED_QUEUE_HEADER`) holding ``rows``, connection ``onceflow_sheets`` pointing at it."""

    def make(rows: list[list[str]]) -> str:
        sid = sheets_emulator.create_spreadsheet("articles", sheets={"queue": [CLAIMED_QUEUE_HEADER, *rows]})
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{DEFAULT_CONN_ID.upper()}",
            sheets_emulator.connection_json(spreadsheet_id=sid),
        )
        return sid

    return make


_DEFAULT_STATE = object()


def emulator_factory(tmp_path: Path) -> Iterator[Callable[..., SheetsEmulator]]:
    """``onceflow_sheets_emulator_factory``: ``factory(state=<tmp file>, port=0)``, each one
    stopped at teardown."""
    made: list[SheetsEmulator] = []

    def factory(state: Any = _DEFAULT_STATE, port: int = 0) -> SheetsEmulator:
        if state is _DEFAULT_STATE:
            state = tmp_path / f"sheets-state-{len(made)}.json"
        started = SheetsEmulator(state, port=port)
        made.append(started)
        return started

    try:
        yield factory
    finally:
        for started in made:
            started.stop()


__all__ = ["CLAIMED_QUEUE_HEADER", "SheetsEmulator", "connection_json"]
