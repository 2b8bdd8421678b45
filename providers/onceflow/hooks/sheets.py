"""SheetQueueHook: the article queue on a Google Sheet, through Airflow's ``GSheetsHook``.

The connection (default ``onceflow_sheets``, type ``google_cloud_platform``) says where and who:
credentials as for any Google connection, or ``"is_anonymous": true`` for the local emulator, plus
these extras, so the same DAG file runs against Google and the emulator:

``api_endpoint``
    Base URL of the Sheets API (omit for Google; ``http://127.0.0.1:PORT/`` for the emulator).
``spreadsheet_id`` / ``sheet`` / ``audit_sheet``
    Where the queue lives (tab names default to ``queue`` and ``audit``); operator arguments win.
``always_verify``
    ``true`` to read back after every claim write (see ``docs/sheet-queue.md``).

The protocol itself is in :mod:`onceflow.sheets.protocol`; this hook only builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.extras import MissingExtra

try:
    from airflow.providers.google.suite.hooks.sheets import GSheetsHook
except ModuleNotFoundError as exc:  # the `sheets` extra is not installed
    raise MissingExtra("sheets", exc.name or "airflow.providers.google") from exc

from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.transport import GoogleSheetsTransport

if TYPE_CHECKING:
    from collections.abc import Sequence

    from onceflow.sheets.retry import Backoff


class SheetQueueHook(GSheetsHook):
    """Claim and update rows of the article queue sheet.

    :param gcp_conn_id: the Google connection; its extras may carry ``api_endpoint``,
        ``spreadsheet_id``, ``sheet`` and ``audit_sheet``.
    :param spreadsheet_id: the spreadsheet (default: the connection's ``spreadsheet_id`` extra).
    :param sheet: the queue tab (default: the ``sheet`` extra, else ``queue``).
    :param api_endpoint: API base URL (default: the ``api_endpoint`` extra, else Google).
    :param impersonation_chain: as for every Google hook.
    """

    conn_name_attr = "gcp_conn_id"
    default_conn_name = "onceflow_sheets"
    conn_type = "google_cloud_platform"
    hook_name = "onceflow Sheet queue"

    def __init__(
        self,
        gcp_conn_id: str = default_conn_name,
        *,
        spreadsheet_id: str | None = None,
        sheet: str | None = None,
        api_endpoint: str | None = None,
        impersonation_chain: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain, api_endpoint=api_endpoint
        )
        self._spreadsheet_id = spreadsheet_id
        self._sheet = sheet
        self._transport_http: Any = None  # transport()'s authorized http

    def _extra(self, name: str) -> Any:
        return self._get_field(name, None)

    def _resolve_endpoint(self) -> None:
        """The connection's ``api_endpoint`` extra, unless one was passed in."""
        if self.api_endpoint is None:
            self.api_endpoint = self._extra("api_endpoint")

    def get_conn(self) -> Any:
        """The ``sheets`` v4 service, on the connection's ``api_endpoint`` if it names one."""
        self._resolve_endpoint()
        return super().get_conn()

    @property
    def spreadsheet_id(self) -> str:
        """The spreadsheet: the argument, else the connection's ``spreadsheet_id`` extra; a clear error when neither is set."""
        value = self._spreadsheet_id or self._extra("spreadsheet_id")
        if not value:
            raise ValueError(
                f"no spreadsheet id: pass spreadsheet_id= or set the 'spreadsheet_id' extra of "
                f"connection {self.gcp_conn_id!r}"
            )
        return str(value)

    @property
    def sheet(self) -> str:
        """The queue's tab: the argument, else the ``sheet`` extra, else ``queue``."""
        return str(self._sheet or self._extra("sheet") or "queue")

    def transport(self, spreadsheet_id: str | None = None) -> GoogleSheetsTransport:
        """The raw API calls, counted per method, on ``spreadsheet_id`` (default: :attr:`spreadsheet_id`).

        Over this process's shared resources (:mod:`onceflow.sheets.service`: built once, not per
        transport) with this hook's own authorized http, made once per hook as ``get_conn()``
        makes its service once (one set of credentials, one token).
        """
        self._resolve_endpoint()
        if self._transport_http is None:
            self._transport_http = self._authorize()
        options = self.get_client_options(api_endpoint_override=self.api_endpoint)
        return GoogleSheetsTransport.shared(
            self._transport_http, spreadsheet_id or self.spreadsheet_id, options
        )

    def queue(
        self,
        version: str = "v1",
        *,
        backoff: Backoff | None = None,
        spread: int = 4,
        always_verify: bool | None = None,
    ) -> SheetQueue:
        """The claim protocol on this connection's queue tab.

        :param version: processing version, part of every run id.
        :param backoff: retry policy for 429s (default: jittered exponential, honours Retry-After).
        :param spread: see :class:`~onceflow.sheets.protocol.SheetQueue`.
        :param always_verify: see :class:`~onceflow.sheets.protocol.SheetQueue` (default: the
            connection's ``always_verify`` extra, else False).
        """
        if always_verify is None:
            always_verify = str(self._extra("always_verify") or "").lower() in ("1", "true", "yes")
        return SheetQueue(
            self.transport(),
            sheet=self.sheet,
            version=version,
            audit_sheet=str(self._extra("audit_sheet") or "audit"),
            backoff=backoff,
            spread=spread,
            always_verify=always_verify,
        )
