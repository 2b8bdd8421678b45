"""The few Sheets API v4 calls the queue makes, behind a small interface.

:class:`SheetsTransport` is what :class:`~onceflow.sheets.protocol.SheetQueue` needs;
:class:`GoogleSheetsTransport` implements it with a google-api-python-client ``sheets`` service
(in Airflow, ``SheetQueueHook.transport()``: the process's shared resources of
:mod:`onceflow.sheets.service` with the connection's authorized http; in tests and benchmarks, a
service built directly). It turns HTTP errors into :class:`~onceflow.sheets.retry.QuotaExceeded`
(429, not applied), :class:`~onceflow.sheets.retry.Refused` (400, not applied) and
:class:`~onceflow.sheets.retry.ServerError` (5xx, maybe applied), and counts calls per method.
The client library's own retries are switched off (``num_retries=0``): a blind retry of a claim
write is exactly what makes its outcome ambiguous, so the protocol decides what to repeat.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from onceflow.sheets.retry import QuotaExceeded, Refused, ServerError


class SheetsTransport(Protocol):
    """The calls the queue protocol makes. Every method is one HTTP request."""

    calls: Counter[str]

    def sheet_ids(self) -> dict[str, int]:
        """Tab title -> sheetId (``spreadsheets.get``)."""

    def read(self, ranges: list[str]) -> list[list[list[Any]]]:
        """``values.batchGet`` with ``valueRenderOption=FORMULA``: values per range."""

    def read_grid(self, range_: str) -> Grid:
        """``spreadsheets.get`` of ``range_`` with its grid data: its tab's title -> sheetId, its
        values as ``read`` gives them, and the developer metadata anchored to each of its rows."""

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``spreadsheets.batchUpdate``: the replies, one per request, in order."""

    def write_values(self, data: list[tuple[str, list[list[str]]]]) -> None:
        """``values.batchUpdate`` with ``valueInputOption=RAW``."""

    def append_values(self, range_: str, rows: list[list[str]]) -> None:
        """``values.append`` with ``RAW`` and ``INSERT_ROWS``."""

    def read_by_filter(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``values.batchGetByDataFilter`` with ``FORMULA``: the MatchedValueRanges."""

    def write_by_filter(self, data: list[tuple[dict[str, Any], list[list[Any]]]]) -> dict[str, Any]:
        """``values.batchUpdateByDataFilter`` with ``RAW``, returning the written rows' values."""

    def search_metadata(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``developerMetadata.search``: the matching DeveloperMetadata entries."""


#: the claim's read (``read_grid``): the tab's id and title, each cell as entered, and each row's
#: developer metadata (``DimensionProperties.developerMetadata``: the row anchors)
GRID_FIELDS = (
    "sheets(properties(sheetId,title),data(rowData(values(userEnteredValue)),"
    "rowMetadata(developerMetadata(metadataId,metadataKey,metadataValue))))"
)


@dataclass(frozen=True)
class Grid:
    """One ``spreadsheets.get`` of a tab's range: the ids, the values, the rows' metadata."""

    #: tab title -> sheetId, of the tab the range is on
    ids: dict[str, int]
    #: the values as ``values.batchGet`` with ``FORMULA`` gives them (trailing empties left out)
    values: list[list[Any]]
    #: 1-based row number -> the DeveloperMetadata anchored to that row (rows without any left out)
    row_metadata: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def _entered(cell: dict[str, Any]) -> Any:
    """A ``CellData``'s ``userEnteredValue`` as ``values.batchGet`` with ``FORMULA`` renders it
    ("" for an empty cell)."""
    value = cell.get("userEnteredValue") or {}
    for kind in ("formulaValue", "stringValue", "numberValue", "boolValue"):
        if kind in value:
            return value[kind]
    return ""


def _retry_after(headers: Any) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP date."""
    value = headers.get("retry-after") if headers is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        when = parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class GoogleSheetsTransport:
    """:class:`SheetsTransport` over a google-api-python-client ``sheets`` v4 service.

    :param service: ``googleapiclient.discovery.build("sheets", "v4", ...)``, or the process's
        shared :class:`~onceflow.sheets.service.SheetsResources` (then ``http`` is required).
    :param spreadsheet_id: the spreadsheet holding the queue.
    :param http: the authorized http every request is executed with (default: the service's).
        Not thread-safe (httplib2), so use one transport per thread.
    """

    def __init__(self, service: Any, spreadsheet_id: str, *, http: Any = None) -> None:
        from onceflow.sheets.service import SheetsResources

        self.service = service
        self.spreadsheet_id = spreadsheet_id
        self.calls: Counter[str] = Counter()
        self._http = http
        if isinstance(service, SheetsResources):
            if http is None:
                raise ValueError("shared sheets resources need the connection's http=")
            self._sheets, self._values = service.spreadsheets, service.values
            self._metadata = service.developer_metadata
        else:
            # making a resource writes its methods' docstrings (~0.1 s for spreadsheets()): once
            self._sheets = service.spreadsheets()
            self._values = self._sheets.values()
            self._metadata = None

    @classmethod
    def shared(cls, http: Any, spreadsheet_id: str, client_options: Any = None) -> GoogleSheetsTransport:
        """A transport over the process's shared resources (:mod:`onceflow.sheets.service`) for
        ``client_options`` (a ``ClientOptions``; ``None``: Google's endpoint), sending every request
        with ``http``, the connection's authorized http."""
        from onceflow.sheets.service import resources_for

        return cls(resources_for(http, client_options), spreadsheet_id, http=http)

    def with_spreadsheet(self, spreadsheet_id: str) -> GoogleSheetsTransport:
        """A transport on another spreadsheet through the same service and http (own call counts)."""
        return GoogleSheetsTransport(self.service, spreadsheet_id, http=self._http)

    def _execute(self, method: str, request: Any) -> Any:
        from googleapiclient.errors import HttpError

        self.calls[method] += 1
        try:
            return request.execute(http=self._http, num_retries=0)  # None: the service's own
        except HttpError as err:
            status = int(err.resp.status)
            retry_after = _retry_after(err.resp)
            if status == 429:
                raise QuotaExceeded(f"{method}: 429 {err}", retry_after) from err
            if status >= 500:
                raise ServerError(f"{method}: {status} {err}", retry_after) from err
            if status == 400:
                raise Refused(f"{method}: 400 {err}") from err
            raise
        except (TimeoutError, OSError) as err:  # connection reset after the request was sent
            raise ServerError(f"{method}: {err!r}") from err

    def sheet_ids(self) -> dict[str, int]:
        """Tab title -> tab id (one ``spreadsheets.get``)."""
        response = self._execute(
            "spreadsheets.get",
            self._sheets.get(spreadsheetId=self.spreadsheet_id, fields="sheets.properties(sheetId,title)"),
        )
        return {s["properties"]["title"]: int(s["properties"]["sheetId"]) for s in response.get("sheets", [])}

    def read_grid(self, range_: str) -> Grid:
        """The tab id, the values of ``range_`` and its rows' anchors in one ``spreadsheets.get``:
        ``ranges`` limits the reply to that tab and range, the ``fields`` mask to the tab's id and
        title, each cell's ``userEnteredValue`` (what the editor typed: a formula's text, never its
        result), which is what ``values.batchGet`` with ``FORMULA`` returns (trailing empty cells
        and rows left out, as that call does), and each row's developer metadata."""
        response = self._execute(
            "spreadsheets.get",
            self._sheets.get(spreadsheetId=self.spreadsheet_id, ranges=[range_], fields=GRID_FIELDS),
        )
        ids: dict[str, int] = {}
        values: list[list[Any]] = []
        metadata: dict[int, list[dict[str, Any]]] = {}
        for sheet in response.get("sheets", []):
            ids[sheet["properties"]["title"]] = int(sheet["properties"]["sheetId"])
            for data in sheet.get("data", [])[:1]:
                values = [[_entered(c) for c in row.get("values", [])] for row in data.get("rowData", [])]
                first = int(data.get("startRow", 0)) + 1
                for i, dimension in enumerate(data.get("rowMetadata", [])):
                    if dimension.get("developerMetadata"):
                        metadata[first + i] = list(dimension["developerMetadata"])
        for row in values:
            while row and row[-1] == "":
                row.pop()
        while values and not values[-1]:
            values.pop()
        return Grid(ids, values, metadata)

    def read(self, ranges: list[str]) -> list[list[list[Any]]]:
        """The values of ``ranges`` (one ``values.batchGet``)."""
        response = self._execute(
            "values.batchGet",
            self._values.batchGet(
                spreadsheetId=self.spreadsheet_id,
                ranges=ranges,
                majorDimension="ROWS",
                valueRenderOption="FORMULA",
            ),
        )
        return [vr.get("values", []) for vr in response.get("valueRanges", [])]

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply ``requests`` atomically (one ``spreadsheets.batchUpdate``); returns the replies."""
        response = self._execute(
            "spreadsheets.batchUpdate",
            self._sheets.batchUpdate(spreadsheetId=self.spreadsheet_id, body={"requests": requests}),
        )
        replies: list[dict[str, Any]] = response.get("replies", [])
        return replies

    def write_values(self, data: list[tuple[str, list[list[str]]]]) -> None:
        """Write raw values to A1 ranges (one ``values.batchUpdate``)."""
        self._execute(
            "values.batchUpdate",
            self._values.batchUpdate(
                spreadsheetId=self.spreadsheet_id,
                body={
                    "valueInputOption": "RAW",
                    "data": [{"range": r, "majorDimension": "ROWS", "values": v} for r, v in data],
                },
            ),
        )

    def append_values(self, range_: str, rows: list[list[str]]) -> None:
        """Append rows after the table of ``range_`` (one ``values.append``)."""
        self._execute(
            "values.append",
            self._values.append(
                spreadsheetId=self.spreadsheet_id,
                range=range_,
                valueInputOption="RAW",
                insertDataOption="INSERT_ROWS",
                body={"majorDimension": "ROWS", "values": rows},
            ),
        )

    def read_by_filter(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Read the ranges that data filters (row anchors) point at (one ``values.batchGetByDataFilter``)."""
        response = self._execute(
            "values.batchGetByDataFilter",
            self._values.batchGetByDataFilter(
                spreadsheetId=self.spreadsheet_id,
                body={"dataFilters": filters, "majorDimension": "ROWS", "valueRenderOption": "FORMULA"},
            ),
        )
        matched: list[dict[str, Any]] = response.get("valueRanges", [])
        return matched

    def write_by_filter(self, data: list[tuple[dict[str, Any], list[list[Any]]]]) -> dict[str, Any]:
        # null cells are skipped by Google ("Null values will be skipped"), so a row-wide write
        # from column A touches only the cells we name
        """Write values through data filters (row anchors), wherever the rows are now (one ``values.batchUpdateByDataFilter``)."""
        response: dict[str, Any] = self._execute(
            "values.batchUpdateByDataFilter",
            self._values.batchUpdateByDataFilter(
                spreadsheetId=self.spreadsheet_id,
                body={
                    "valueInputOption": "RAW",
                    "data": [{"dataFilter": f, "majorDimension": "ROWS", "values": v} for f, v in data],
                    "includeValuesInResponse": True,
                    "responseValueRenderOption": "FORMULA",
                },
            ),
        )
        return response

    def search_metadata(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The developer metadata matching the filters (one ``developerMetadata.search``)."""
        response = self._execute(
            "developerMetadata.search",
            self._developer_metadata().search(
                spreadsheetId=self.spreadsheet_id, body={"dataFilters": filters}
            ),
        )
        return [m["developerMetadata"] for m in response.get("matchedDeveloperMetadata", [])]

    def _developer_metadata(self) -> Any:
        if self._metadata is None:
            self._metadata = self._sheets.developerMetadata()
        return self._metadata

    def add_sheet(self, title: str) -> None:
        """Add a tab named ``title``."""
        self.batch_update([{"addSheet": {"properties": {"title": title}}}])


def anonymous_service(endpoint: str) -> Any:
    """A ``sheets`` v4 service with anonymous credentials on ``endpoint`` (an emulator).

    Uses the discovery document bundled with google-api-python-client: nothing goes to the network.
    In Airflow, use :class:`~onceflow.hooks.sheets.SheetQueueHook` instead, which reads the endpoint
    and credentials from the ``onceflow_sheets`` connection.
    """
    from google.auth.credentials import AnonymousCredentials
    from googleapiclient.discovery import build

    return build(
        "sheets",
        "v4",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
        cache_discovery=False,
        static_discovery=True,
    )
