"""The claim protocol: claim K rows with one read, one conditional write and one verification read.

1. **Read** the queue tab in one ``values.batchGet`` and pick NEW rows.
2. **Claim** them in one ``spreadsheets.batchUpdate`` holding one ``findReplace`` per row, aimed at
   that row's status cell with ``matchEntireCell`` and ``matchCase``: the exact text we read
   (``NEW``, ``new `` ...) -> ``PROCESSING #<token>``, a token unique to that request. The server
   applies each request only if the cell still says what we read, so two claimers can never both
   turn the same cell into their token.
3. **Verify** with one more read: a claim is won iff the token is in the sheet. The reply's
   ``occurrencesChanged`` is only a hint (a 500 after apply loses the reply). Because rows move
   between read and write, the row carrying the token may not be the row aimed at; it was NEW
   (the find matched), so it is legitimately ours, and the work created is for the URL *beside the
   token in the verification read*, never for the row we intended. Nothing is created before this.
4. Rows that turn out INVALID or DUPLICATE get their reason and final status by token.

The claim batch also anchors each claimed row with developer metadata ``onceflow.claim = <token>``
(same position, same atomic batch as the claim, so it lands on the row the claim changed). Later
writes find the row by token: status changes are ``findReplace`` over the whole status column
keyed by ``<STATUS> #<token>`` (position-free and fenced: it applies only if the row is still in
the expected state); other cells go through ``values.batchUpdateByDataFilter`` on the anchor,
which the server resolves to the row wherever it has moved. ``docs/sheet-queue.md`` has the
argument and its assumptions.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from onceflow.sheets import anchors, settle
from onceflow.sheets.a1 import a1_sheet, column_letter
from onceflow.sheets.anchored import AnchoredRows
from onceflow.sheets.audit import AUDIT_HEADER, AuditTab
from onceflow.sheets.keys import article_run_conf, check_version, pipeline_run_id
from onceflow.sheets.model import (
    ColumnMap,
    Row,
    Snapshot,
    Status,
    new_token,
    status_value,
    token_time,
)
from onceflow.sheets.retry import Backoff, Refused, RetryableError, ServerError
from onceflow.sheets.validation import classify_claimed, classify_new_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Sequence

    from onceflow.sheets.transport import SheetsTransport

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["AUDIT_HEADER", "Claim", "ClaimResult", "Rejection", "SheetQueue", "a1_sheet", "column_letter"]


@dataclass(frozen=True)
class Claim:
    """A row this claimer won, as found beside its token in the verification read."""

    token: str
    row_key: str
    url: str
    run_id: str
    row_number: int
    claimed_at: datetime

    def conf(self, spreadsheet_id: str, sheet: str, version: str) -> dict[str, str]:
        """The ``article_pipeline`` run conf: enough to find the row again by token."""
        return article_run_conf(
            token=self.token,
            key=self.row_key,
            url=self.url,
            spreadsheet_id=spreadsheet_id,
            sheet=sheet,
            version=version,
        )


@dataclass(frozen=True)
class Rejection:
    """A NEW row this claimer took (it is ``PROCESSING #token``, anchored) to be INVALID or
    DUPLICATE: its final status and reason are the caller's to send, through the ledger's outbox
    (:func:`onceflow.sheets.wakeup.wake_up`), as every final status leaves."""

    token: str
    status: Status
    reason: str
    row_number: int
    url: str
    #: the article its URL names (a DUPLICATE's); None for an INVALID URL
    row_key: str | None = None


@dataclass
class ClaimResult:
    """What one claim pass did: the rows claimed, the rows refused with their reason, and the counts."""

    claims: list[Claim] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    aimed: int = 0
    lost: int = 0
    #: claims that landed on a different row than aimed at (rows moved between read and write)
    redirected: int = 0
    #: claims confirmed only by the read-back, the write's reply having been lost (5xx after apply)
    recovered: int = 0
    #: the requests this wake-up sent, per API method (429-refused attempts included)
    requests: Counter[str] = field(default_factory=Counter)


def _occurrences(reply: dict[str, Any]) -> int:
    # proto3 JSON omits zero values: a miss comes back as {"findReplace": {}}
    return int(reply.get("findReplace", {}).get("occurrencesChanged", 0) or 0)


class SheetQueue:
    """The article queue on one tab of one spreadsheet.

    :param transport: the Sheets API calls (one transport per thread).
    :param sheet: tab title of the queue.
    :param version: processing version, part of every run id and claim token (``ValueError``
        unless it matches ``[A-Za-z0-9_.-]{1,40}``).
    :param audit_sheet: tab title of the audit log.
    :param backoff: retry policy for 429s and failed reads.
    :param clock: returns the current aware time (a fake clock in tests).
    :param spread: pick claim targets at random among the first ``spread * limit`` NEW rows, so
        concurrent claimers rarely aim at the same cells; 1 means strictly first-come.
    :param always_verify: read back after every claim write, even when each claim's URL guard
        confirmed it in place (one more read per wake-up; drops the reliance on the per-request
        ``occurrencesChanged`` replies, see ``docs/sheet-queue.md``).
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
        spread: int = 4,
        rng: random.Random | None = None,
        always_verify: bool = False,
    ) -> None:
        self.transport = transport
        self.sheet = sheet
        # checked before any claim: the version rides in every claim token, and one a run id
        # cannot carry would leave rows PROCESSING under a token nothing can parse or repair
        self.version = check_version(version)
        self.audit_sheet = audit_sheet
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.spread = max(1, spread)
        self.always_verify = always_verify
        self.rng = rng or random.Random()
        self._sheet_ids: dict[str, int] | None = None
        self._columns: ColumnMap | None = None
        #: reads and writes through row anchors (onceflow.sheets.anchored)
        self.anchored = AnchoredRows(self)
        #: the audit tab (onceflow.sheets.audit)
        self.audit_tab = AuditTab(self)

    # -- reads -------------------------------------------------------------------------------------

    def _idempotent(self, fn: Callable[[], T]) -> T:
        """Call a request that is safe to repeat: retry 429s and 5xx alike."""

        def attempt() -> T:
            try:
                return fn()
            except ServerError as err:
                raise RetryableError(str(err), err.retry_after) from err

        return self.backoff.call(attempt)

    def _read(self, ranges: list[str]) -> list[list[list[Any]]]:
        return self._idempotent(lambda: self.transport.read(ranges))

    def snapshot(self, *, with_id: bool = False) -> Snapshot:
        """One consistent read of the whole queue tab: one request, whatever the sheet size.

        :param with_id: read the tab's id in the same request (one ``spreadsheets.get`` with the
            values in its grid data, instead of a ``values.batchGet``): the claim's read, so the
            id its conditional writes address is the one of the tab its values came from.
        """
        if with_id:
            found, values = self._idempotent(lambda: self.transport.read_with_ids(a1_sheet(self.sheet)))
            self._sheet_ids = {**(self._sheet_ids or {}), **found}
        else:
            values = self._read([a1_sheet(self.sheet)])[0]
        snapshot = Snapshot.from_values(values)
        self._columns = snapshot.columns
        return snapshot

    def sheet_id(self, title: str | None = None) -> int:
        """The numeric sheetId ``findReplace`` ranges need; fetched once per queue object."""
        title = title or self.sheet
        if self._sheet_ids is None or title not in self._sheet_ids:
            self._sheet_ids = self._idempotent(self.transport.sheet_ids)
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

    # -- the claim ---------------------------------------------------------------------------------

    def _cell(self, row_number: int, column: int) -> dict[str, int]:
        return {
            "sheetId": self.sheet_id(),
            "startRowIndex": row_number - 1,
            "endRowIndex": row_number,
            "startColumnIndex": column,
            "endColumnIndex": column + 1,
        }

    def _status_column(self, columns: ColumnMap) -> dict[str, int]:
        c = columns["status"]
        return {
            "sheetId": self.sheet_id(),
            "startRowIndex": 1,
            "startColumnIndex": c,
            "endColumnIndex": c + 1,
        }

    @staticmethod
    def _find_replace(grid_range: dict[str, int], find: str, replacement: str) -> dict[str, Any]:
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

    def _pick_targets(self, snapshot: Snapshot, limit: int) -> tuple[list[Row], list[Row]]:
        verdicts = classify_new_rows(snapshot)
        good = [v.row for v in verdicts if v.ok]
        window = good[: limit * self.spread]
        chosen = sorted(self.rng.sample(window, min(limit, len(window))), key=lambda r: r.number)
        aimed = {r.number for r in chosen}
        # a DUPLICATE is marked only together with (or after) the row it points at, so the
        # later row never ends up owning the article because the first was not picked this time
        bad = [
            v.row
            for v in verdicts
            if not v.ok and (v.first is None or v.first.status is not Status.NEW or v.first.number in aimed)
        ][:limit]
        return chosen, bad

    def claim(self, limit: int, attempts: int = 3) -> ClaimResult:
        """Claim up to ``limit`` NEW rows; also claim and mark (up to ``limit``) bad NEW rows.

        Costs one read and one ``batchUpdate`` whatever ``limit`` and the sheet size, plus one
        verification read when the write's outcome is unknown or some row moved, one write to
        drop the row anchors of lost claims, and two more writes when some claimed rows turn out
        INVALID or DUPLICATE.

        :param limit: most rows to claim for work.
        :param attempts: tries when the claim batch is refused (400) because rows were deleted
            under it so that an aimed-at row is past the end of the sheet; nothing was applied,
            so the claim starts again from a fresh read.
        :return: the rows won (create their runs now) and the rows rejected.
        """
        before = Counter(self.transport.calls)
        swept = False
        squeezed = False  # at the metadata cap: the bad rows to mark share the room with the good
        refusals = 0
        while True:
            try:
                result = self._claim_once(limit, squeezed=squeezed)
                result.requests = Counter(self.transport.calls) - before
                return result
            except Refused as err:
                if "developer metadata" in str(err).lower() and not swept:
                    # Google's cap on developer metadata: drop the anchors of rows no longer in
                    # flight (finished some other way), then try again
                    swept = True
                    removed = self.sweep_anchors()
                    log.warning("claim refused (%s); removed %d stale row anchors", err, removed)
                    if removed:
                        continue  # the sweep made room: that refusal does not count as a try
                if "developer metadata" in str(err).lower():
                    # no room for one anchor per row asked: take what fits (halving costs 1 read +
                    # 1 write per step; Google's 400 does not say how much room is left)
                    if limit > 1 or not squeezed:
                        limit = max(1, limit // 2)  # and from now on the rows to mark count too
                        squeezed = True
                        log.warning("claim refused at the metadata cap; claiming %d rows instead", limit)
                        continue
                    raise Refused(
                        f"{err} (every row anchor belongs to a row in flight: each PROCESSING row "
                        "holds one, and Google caps developer metadata at 30,000 characters per "
                        "sheet; finish rows before claiming more)"
                    ) from err
                refusals += 1
                if refusals >= attempts:
                    raise
                log.warning("claim batch refused (%s); nothing applied, reading again", err)

    def _claim_once(self, limit: int, *, squeezed: bool = False) -> ClaimResult:
        result = ClaimResult()
        snapshot = self.snapshot(with_id=True)
        if snapshot.columns is None or limit <= 0:
            return result
        good, bad = self._pick_targets(snapshot, limit)
        if squeezed:  # one anchor per target: at most ``limit`` of them in all
            bad = bad[: max(0, limit - len(good))]
        targets = good + bad
        if not targets:
            return result
        result.aimed = len(targets)
        issued: dict[str, Row] = {}  # token -> the row it was aimed at
        status_col, url_col = snapshot.columns["status"], snapshot.columns["url"]
        layout: list[tuple[str, bool]] = []  # per target: its token, whether a URL guard follows
        sheet_id = self.sheet_id()

        def attempt() -> list[dict[str, Any]]:
            # fresh tokens on every attempt: one token can then match at most one cell, ever
            now = self.clock()
            tokens = [new_token(now, secrets.token_hex(5), self.version) for _ in targets]
            issued.update(zip(tokens, targets, strict=True))
            layout.clear()
            requests = []
            for i, (row, token) in enumerate(zip(targets, tokens, strict=True)):
                requests.append(
                    self._find_replace(
                        self._cell(row.number, status_col),
                        row.status_cell.raw,
                        status_value(Status.PROCESSING, token),
                    )
                )
                # the guard: the same row's URL cell must still hold the URL we read; applied in the
                # same atomic batch, so both replies describe one row at one moment
                guarded = i < len(good)
                if guarded:
                    requests.append(self._find_replace(self._cell(row.number, url_col), row.url, row.url))
                # the row anchor: same position, same atomic batch, so it lands on the row whose
                # status cell the claim changed (if it changed one); later writes go through it
                requests.append(anchors.create(sheet_id, row.number, token))
                layout.append((token, guarded))
            return self.transport.batch_update(requests)

        replies: list[dict[str, Any]] | None = None
        refusal: Refused | None = None
        try:
            replies = self.backoff.call(attempt)
            log.info("claim write: %d replies for %d rows", len(replies), len(targets))
        except ServerError as err:  # maybe applied: the verification read decides
            log.warning("claim write outcome unknown (%s); verifying by reading back", err)
        except Refused as err:
            # a 400 only says *this copy* applied nothing: httplib2 may have sent an earlier copy
            # whose reply was lost and which was applied (its anchors then fill the metadata room
            # the resent copy is refused for). Only the sheet can tell: read back below.
            refusal = err
            log.warning("claim write refused (%s); reading back for an applied earlier copy", err)

        confirmed: dict[str, Row] = {}
        must_read = replies is None or bool(bad) or self.always_verify
        #: token -> id of the anchor this reply created for a claim it did not apply itself
        unapplied: dict[str, int] = {}
        if replies is not None:
            position = iter(replies)
            for token, guarded in layout:
                claimed = _occurrences(next(position, {})) == 1
                held = guarded and _occurrences(next(position, {})) == 1
                created = anchors.created_id(next(position, {}))
                if not claimed and created is not None:
                    unapplied[token] = created
                if claimed and held:
                    confirmed[token] = issued[token]
                else:
                    # claim 1, guard 0: our token landed on a row that no longer has the URL we
                    # read. Claim 0: lost, or won by a copy of this very batch that the transport
                    # sent before (httplib2 resends a request whose connection dropped without a
                    # reply, whatever num_retries says; the resend then finds our own token). Only
                    # the sheet can tell, and the anchors of a claim taken for lost are deleted.
                    must_read = True
        if must_read:
            verified = self.snapshot()
            found = {t: rows for t, rows in verified.by_token().items() if t in issued}
            mine = {t: rows[0] for t, rows in found.items()}
            extra = [(t, r) for t, rows in found.items() for r in rows[1:]]
            if extra:  # only possible if something repeated our exact request body
                self._retoken(verified, extra)
                # the re-token is a conditional write aimed at a position: rows may have moved
                # under it, so which row kept the token is read, never assumed; a token still on
                # several rows is handed out to none (sheet_reconcile drives those rows)
                verified = self.snapshot()
                found = {t: rows for t, rows in verified.by_token().items() if t in issued}
                mine = {t: rows[0] for t, rows in found.items() if len(rows) == 1}
        else:  # every claim confirmed in place by its guard: the first read is still the truth
            verified, mine = snapshot, confirmed
        if refusal is not None and not mine:
            raise refusal  # nothing of ours is in the sheet: the batch was refused whole
        if replies is None:
            result.recovered = len(mine)
        # anchors of lost claims sit on rows that do not carry their token: remove them (by
        # token, so never anyone else's); a 429-refused attempt applied nothing, so it has none
        sent = [token for token, _ in layout]
        stray = [anchors.delete(anchors.lookup(t)) for t in sent if t not in mine]
        # a claim won by an earlier copy of this batch (its reply lost, the batch resent) was
        # anchored by both copies: the resent copy's anchor goes by its id, so each row in flight
        # holds one anchor and resends do not eat the metadata room
        stray += [anchors.delete(anchors.by_id(i)) for t, i in unapplied.items() if t in mine]
        verdicts = classify_claimed(verified, mine)
        rejects = {t: v for t, v in verdicts.items() if not v.ok}
        result.redirected = sum(1 for t, row in mine.items() if row.url != issued[t].url)
        for token, verdict in sorted(verdicts.items(), key=lambda tv: tv[1].row.number):
            if verdict.ok and verdict.key and verdict.normalised_url:
                result.claims.append(
                    Claim(
                        token=token,
                        row_key=verdict.key,
                        url=verdict.normalised_url,
                        run_id=pipeline_run_id(verdict.key, self.version),
                        row_number=verdict.row.number,
                        claimed_at=token_time(token) or self.clock(),
                    )
                )
        if stray:
            self.cleanup(stray)
        # INVALID and DUPLICATE leave the way every final status does, through the outbox: the
        # rows stay PROCESSING #token, anchored, until the caller's relay writes them
        result.rejected = [
            Rejection(t, v.status, v.reason, v.row.number, v.row.url, v.key)
            for t, v in sorted(rejects.items(), key=lambda tv: tv[1].row.number)
            if v.status
        ]
        result.lost = len(targets) - len(mine)
        return result

    def _retoken(self, snapshot: Snapshot, extra: list[tuple[str, Row]]) -> None:
        """Give second and later rows carrying one token a fresh token of their own.

        Each request is aimed at one cell and matches only our own token, so even if the row has
        moved it cannot touch anyone else's cell; a missed one is left to ``sheet_reconcile``.
        """
        assert snapshot.columns is not None
        col = snapshot.columns["status"]
        now = self.clock()
        requests = []
        for token, row in extra:
            fresh = new_token(now, secrets.token_hex(5), self.version)
            requests.append(
                self._find_replace(
                    self._cell(row.number, col),
                    status_value(Status.PROCESSING, token),
                    status_value(Status.PROCESSING, fresh),
                )
            )
            requests.append(anchors.create(self.sheet_id(), row.number, fresh))
        # the old token's anchors on those rows are found and dropped by write_fields (by id)
        try:
            self.backoff.call(lambda: self.transport.batch_update(requests))
        except ServerError as err:
            log.warning("re-tokening duplicate claims failed (%s); sheet_reconcile will see them", err)

    # -- later writes, by token --------------------------------------------------------------------

    def cleanup(self, requests: list[dict[str, Any]]) -> None:
        """Delete stray anchors (idempotent; a failure only leaves harmless metadata behind)."""
        try:
            self._idempotent(lambda: self.transport.batch_update(requests))
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
        requests = [
            self._find_replace(
                self._status_column(columns), status_value(old, token), status_value(new, token)
            )
            for token, old, new in moves
        ]
        requests.extend(extra or [])
        try:
            replies = self.backoff.call(lambda: self.transport.batch_update(requests))
            moved = [_occurrences(r) == 1 for r in replies[: len(moves)]]
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

    def finish(
        self,
        token: str,
        new: Status,
        fields: dict[str, str] | None = None,
        old: Status | Collection[Status] = Status.PROCESSING,
        *,
        same: Callable[[Row], bool] | None = None,
    ) -> bool:
        """Settle the row of ``token``: write ``fields``, then ``old`` (PROCESSING by default) ->
        ``new`` (final) with its row anchor deleted in the same batch, unless ``same`` refuses the
        row. See :func:`onceflow.sheets.settle.finish_many`."""
        return settle.finish_many(self, [(token, new, fields)], old, same=same)[0]

    def finish_many(self, items: Sequence[settle.Finish]) -> list[bool]:
        """:meth:`finish` for many rows at the cost of one (1 read + 2 writes)."""
        return settle.finish_many(self, items)

    def sweep_anchors(self, released: Collection[str] = ()) -> int:
        """Delete row anchors of rows no longer in flight (:func:`onceflow.sheets.settle.sweep_anchors`)."""
        return settle.sweep_anchors(self, released)

    def search_anchors(self) -> list[dict[str, Any]]:
        """Every claim anchor of the spreadsheet (``developerMetadata.search`` by key)."""
        lookup = {"developerMetadataLookup": {"metadataKey": anchors.CLAIM_KEY}}
        return self._idempotent(lambda: self.transport.search_metadata([lookup]))

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

    # -- by the row's anchor (onceflow.sheets.anchored) -------------------------------------------

    def anchored_rows(self, tokens: Sequence[str]) -> tuple[ColumnMap | None, dict[str, list[Row]]]:
        """The header and, per token, every row anchored to it: one ``values.batchGetByDataFilter``."""
        return self.anchored.rows(tokens)

    def write_anchored(self, columns: ColumnMap, updates: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
        """Each token's fields into the row its anchor is on: one ``values.batchUpdateByDataFilter``."""
        return self.anchored.write(columns, updates)

    def locate(self, token: str) -> Row | None:
        """The row anchored to ``token`` that carries it (a full read for claims without an anchor)."""
        return self.anchored.locate(token)

    def write_fields(
        self,
        token: str,
        fields: dict[str, str],
        attempts: int = 3,
        check: Callable[[Row], None] | None = None,
    ) -> Row:
        """Write ``fields`` into the row of ``token`` through its anchor, 1 read + 1 write
        (:meth:`onceflow.sheets.anchored.AnchoredRows.write_fields`)."""
        return self.anchored.write_fields(token, fields, attempts=attempts, check=check)

    # -- the audit tab (onceflow.sheets.audit) ------------------------------------------------------

    def audit(self, entries: list[dict[str, str]]) -> None:
        """Append entries (keys from :data:`AUDIT_HEADER`) to the audit tab, creating it if needed."""
        self.audit_tab.append(entries)

    def read_audit(self) -> list[dict[str, str]]:
        """The audit tab as dicts; empty if the tab does not exist yet."""
        return self.audit_tab.read()
