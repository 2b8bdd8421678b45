"""One queue tab's requests: its reads, the fenced status batch, and the request builders.

The layer every job of the queue (claim, settle, the anchored writes, the audit tab, the relay)
calls down into, above the Sheets API calls of :mod:`onceflow.sheets.transport`. It knows the
tab's title and id, the header as last read, and the retry policy; it never calls back up.

Status changes are ``findReplace`` over the whole status column keyed by ``<STATUS> #<token>``
(:meth:`QueueTab.transition_many`): position-free, and fenced, since each applies only while the
row is still ours and still in the expected state.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from onceflow.sheets import anchors
from onceflow.sheets.a1 import a1_sheet
from onceflow.sheets.keys import check_version
from onceflow.sheets.model import ColumnMap, Row, Snapshot, Status, status_value
from onceflow.sheets.retry import Backoff, RetryableError, ServerError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from onceflow.sheets.transport import SheetsTransport

log = logging.getLogger(__name__)
T = TypeVar("T")


def occurrences(reply: dict[str, Any]) -> int:
    """``occurrencesChanged`` of a ``findReplace`` reply (proto3 JSON omits zeros: a miss comes
    back as ``{"findReplace": {}}``)."""
    return int(reply.get("findReplace", {}).get("occurrencesChanged", 0) or 0)


def find_replace(grid_range: dict[str, int], find: str, replacement: str) -> dict[str, Any]:
    """A ``findReplace`` request matching the whole cell, case and all, never a formula."""
    return {
        "findReplace": {
            "find": find,
            "replacement": replacement,
            "range": grid_range,
            "matchCase": True,
            "matchEntireCell": True,
            "searchByRegex": False,
            "includeFormulas": False,
        }
    }


class QueueTab:
    """The queue's tab of one spreadsheet, as the jobs of the queue address it.

    :param transport: the Sheets API calls (one transport per thread).
    :param sheet: tab title of the queue.
    :param version: processing version, part of every run id and claim token (``ValueError``
        unless it matches ``[A-Za-z0-9_.-]{1,40}``).
    :param audit_sheet: tab title of the audit log.
    :param backoff: retry policy for 429s and failed reads.
    :param clock: returns the current aware time (a fake clock in tests).
    """

    def __init__(
        self,
        transport: SheetsTransport,
        *,
        sheet: str = "queue",
        version: str = "v1",
        audit_sheet: str = "audit",
        backoff: Backoff | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.transport = transport
        self.sheet = sheet
        # checked before any claim: the version rides in every claim token, and one a run id
        # cannot carry would leave rows PROCESSING under a token nothing can parse or repair
        self.version = check_version(version)
        self.audit_sheet = audit_sheet
        self.backoff = backoff or Backoff()
        self.clock = clock
        self._sheet_ids: dict[str, int] | None = None
        self._columns: ColumnMap | None = None

    # -- reads -------------------------------------------------------------------------------------

    def idempotent(self, fn: Callable[[], T]) -> T:
        """Call a request that is safe to repeat: retry 429s and 5xx alike."""

        def attempt() -> T:
            try:
                return fn()
            except ServerError as err:
                raise RetryableError(str(err), err.retry_after) from err

        return self.backoff.call(attempt)

    def read(self, ranges: list[str]) -> list[list[list[Any]]]:
        """The values of ``ranges`` (one ``values.batchGet``, retried)."""
        return self.idempotent(lambda: self.transport.read(ranges))

    def snapshot(self, *, with_id: bool = False) -> Snapshot:
        """One consistent read of the whole queue tab: one request, whatever the sheet size.

        :param with_id: read the tab's id in the same request (one ``spreadsheets.get`` with the
            values in its grid data, instead of a ``values.batchGet``): the claim's read, so the
            id its conditional writes address is the one of the tab its values came from. It also
            brings every row's anchors (``Snapshot.anchors``), what a by-anchor read would give,
            so a relay riding in the same wake-up needs no read of its own.
        """
        if with_id:
            grid = self.idempotent(lambda: self.transport.read_grid(a1_sheet(self.sheet)))
            self._sheet_ids = {**(self._sheet_ids or {}), **grid.ids}
            anchored = {
                number: tuple(
                    (str(m.get("metadataValue", "")), int(m.get("metadataId", 0)))
                    for m in found
                    if m.get("metadataKey") == anchors.CLAIM_KEY
                )
                for number, found in grid.row_metadata.items()
            }
            snapshot = Snapshot.from_values(grid.values, {n: t for n, t in anchored.items() if t})
        else:
            snapshot = Snapshot.from_values(self.read([a1_sheet(self.sheet)])[0])
        self._columns = snapshot.columns
        return snapshot

    def sheet_id(self, title: str | None = None) -> int:
        """The numeric sheetId ``findReplace`` ranges need; fetched once per queue object."""
        title = title or self.sheet
        if self._sheet_ids is None or title not in self._sheet_ids:
            self._sheet_ids = self.idempotent(self.transport.sheet_ids)
        if title not in self._sheet_ids:
            raise KeyError(f"spreadsheet has no tab named {title!r}; tabs: {sorted(self._sheet_ids)}")
        return self._sheet_ids[title]

    @property
    def columns(self) -> ColumnMap | None:
        """The header as last read by any request of this queue (``None`` before the first)."""
        return self._columns

    def remember_columns(self, columns: ColumnMap) -> None:
        """The header as last read (by any request), for a later ``transition``."""
        self._columns = columns

    def forget_sheet_ids(self) -> None:
        """Tabs changed (one was added): fetch the ids again when next needed."""
        self._sheet_ids = None

    def find(self, token: str) -> Row | None:
        """The row carrying ``token`` in its status cell, wherever it is now."""
        rows = self.snapshot().rows_with_token(token)
        return rows[0] if rows else None

    def search_anchors(self) -> list[dict[str, Any]]:
        """Every claim anchor of the spreadsheet (``developerMetadata.search`` by key)."""
        lookup = {"developerMetadataLookup": {"metadataKey": anchors.CLAIM_KEY}}
        return self.idempotent(lambda: self.transport.search_metadata([lookup]))

    # -- request builders --------------------------------------------------------------------------

    def cell(self, row_number: int, column: int) -> dict[str, int]:
        """The GridRange of one cell of the tab (1-based row number, 0-based column)."""
        return {
            "sheetId": self.sheet_id(),
            "startRowIndex": row_number - 1,
            "endRowIndex": row_number,
            "startColumnIndex": column,
            "endColumnIndex": column + 1,
        }

    def status_column(self, columns: ColumnMap) -> dict[str, int]:
        """The GridRange of the status column below the header."""
        c = columns["status"]
        return {
            "sheetId": self.sheet_id(),
            "startRowIndex": 1,
            "startColumnIndex": c,
            "endColumnIndex": c + 1,
        }

    def moves(self, columns: ColumnMap, moves: Iterable[tuple[str, Status, Status]]) -> list[dict[str, Any]]:
        """The fenced ``findReplace`` of each (token, old, new) over the status column."""
        column = self.status_column(columns)
        return [find_replace(column, status_value(old, t), status_value(new, t)) for t, old, new in moves]

    # -- writes ------------------------------------------------------------------------------------

    def cleanup(self, requests: list[dict[str, Any]]) -> None:
        """Delete stray anchors (idempotent; a failure only leaves harmless metadata behind)."""
        try:
            self.idempotent(lambda: self.transport.batch_update(requests))
        except Exception as err:  # best effort: write_fields ignores and drops stray anchors
            log.warning("could not delete %d stray row anchors (%s)", len(requests), err)

    def transition_many(
        self,
        columns: ColumnMap,
        moves: Iterable[tuple[str, Status, Status]],
        extra: list[dict[str, Any]] | None = None,
        verify: bool = False,
        extra_replies: list[dict[str, Any]] | None = None,
    ) -> list[bool]:
        """One ``batchUpdate`` of fenced status moves (plus ``extra`` requests); per move, whether
        it applied. A 5xx is settled by reading the sheet back.

        :param verify: also read back when a move replied 0, and count a row already in its new
            status as moved: a 0 can be this very batch's resent copy (httplib2 resends a request
            whose reply was lost) finding the row moved by the first copy. Without it, 0 means "not
            moved by this call", which is what a caller that must act once needs.
        :param extra_replies: filled with the replies to ``extra`` (left empty when the outcome
            is unknown: a 5xx).
        """
        moves = list(moves)
        if not moves:
            if extra:
                self.cleanup(extra)
            return []
        requests = self.moves(columns, moves) + list(extra or [])
        try:
            replies = self.backoff.call(lambda: self.transport.batch_update(requests))
            moved = [occurrences(r) == 1 for r in replies[: len(moves)]]
            if extra_replies is not None:
                extra_replies.extend(replies[len(moves) :])
            if all(moved) or not verify:
                return moved
        except ServerError:
            moved = [False] * len(moves)
        # unknown outcome, or a 0 that may be our own resent copy finding the row already moved
        # (httplib2 resends a request whose reply was lost): the sheet decides
        after = self.snapshot()
        return [
            done or any(r.status is new for r in after.rows_with_token(token))
            for done, (token, _old, new) in zip(moved, moves, strict=True)
        ]

    def transition(self, token: str, old: Status, new: Status) -> bool:
        """Move the row carrying ``token`` from ``old`` to ``new``, wherever the row is now.

        A ``findReplace`` over the whole status column of ``<OLD> #<token>``: it applies only if
        the row is still ours and still in ``old`` (a fenced write). Returns whether it moved
        (True also when an ambiguous earlier attempt had already moved it).
        """
        cached = self._columns
        columns = cached or self.snapshot().columns
        if columns is None:
            return False
        moved = self.transition_many(columns, [(token, old, new)])[0]
        if not moved and cached is not None:  # the editor may have moved the status column
            fresh = self.snapshot().columns
            if fresh is not None and fresh != cached:
                moved = self.transition_many(fresh, [(token, old, new)])[0]
        return moved
