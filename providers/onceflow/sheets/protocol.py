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

Later writes find the row by token: status changes are ``findReplace`` over the whole status
column keyed by ``<STATUS> #<token>`` (position-free and fenced: it applies only if the row is
still in the expected state); other cells are located by token in a fresh read, written, and
checked by reading back. ``docs/sheet-queue.md`` has the argument and its assumptions.
"""

from __future__ import annotations

import logging
import random
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from onceflow.sheets.keys import pipeline_run_id
from onceflow.sheets.model import (
    ColumnMap,
    Row,
    Snapshot,
    Status,
    new_token,
    status_value,
    token_time,
)
from onceflow.sheets.retry import Backoff, RetryableError, ServerError
from onceflow.sheets.validation import classify_claimed, classify_new_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from onceflow.sheets.transport import SheetsTransport

log = logging.getLogger(__name__)
T = TypeVar("T")

AUDIT_HEADER = ["time", "action", "reason", "row_key", "url", "claim_token", "run_id"]


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
        return {
            "claim_token": self.token,
            "row_key": self.row_key,
            "url": self.url,
            "spreadsheet_id": spreadsheet_id,
            "sheet": sheet,
            "processing_version": version,
        }


@dataclass(frozen=True)
class Rejection:
    """A NEW row this claimer marked INVALID or DUPLICATE."""

    token: str
    status: Status
    reason: str
    row_number: int
    url: str


@dataclass
class ClaimResult:
    claims: list[Claim] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    aimed: int = 0
    lost: int = 0
    #: claims that landed on a different row than aimed at (rows moved between read and write)
    redirected: int = 0
    #: claims confirmed only by the read-back, the write's reply having been lost (5xx after apply)
    recovered: int = 0


def a1_sheet(title: str) -> str:
    """A1 notation for a whole tab, quoted so any title works."""
    return "'" + title.replace("'", "''") + "'"


def column_letter(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA."""
    letters = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        letters = chr(65 + rem) + letters
    return letters


def _occurrences(reply: dict[str, Any]) -> int:
    # proto3 JSON omits zero values: a miss comes back as {"findReplace": {}}
    return int(reply.get("findReplace", {}).get("occurrencesChanged", 0) or 0)


class SheetQueue:
    """The article queue on one tab of one spreadsheet.

    :param transport: the Sheets API calls (one transport per thread).
    :param sheet: tab title of the queue.
    :param version: processing version, part of every run id.
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
        self.version = version
        self.audit_sheet = audit_sheet
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.spread = max(1, spread)
        self.always_verify = always_verify
        self.rng = rng or random.Random()
        self._sheet_ids: dict[str, int] | None = None
        self._columns: ColumnMap | None = None

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

    def snapshot(self) -> Snapshot:
        """One consistent read of the whole queue tab: one request, whatever the sheet size."""
        snapshot = Snapshot.from_values(self._read([a1_sheet(self.sheet)])[0])
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

    def claim(self, limit: int) -> ClaimResult:
        """Claim up to ``limit`` NEW rows; also claim and mark (up to ``limit``) bad NEW rows.

        Costs one read and one ``batchUpdate`` whatever ``limit`` and the sheet size, plus one
        verification read when the write's outcome is unknown or some row moved, and two more
        writes when some claimed rows turn out INVALID or DUPLICATE.

        :param limit: most rows to claim for work.
        :return: the rows won (create their runs now) and the rows rejected.
        """
        result = ClaimResult()
        snapshot = self.snapshot()
        if snapshot.columns is None or limit <= 0:
            return result
        good, bad = self._pick_targets(snapshot, limit)
        targets = good + bad
        if not targets:
            return result
        result.aimed = len(targets)
        issued: dict[str, Row] = {}  # token -> the row it was aimed at
        status_col, url_col = snapshot.columns["status"], snapshot.columns["url"]
        layout: list[tuple[str, bool]] = []  # per target: its token, whether a URL guard follows

        def attempt() -> list[dict[str, Any]]:
            # fresh tokens on every attempt: one token can then match at most one cell, ever
            now = self.clock()
            tokens = [new_token(now, secrets.token_hex(5)) for _ in targets]
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
                layout.append((token, guarded))
            return self.transport.batch_update(requests)

        replies: list[dict[str, Any]] | None = None
        try:
            replies = self.backoff.call(attempt)
            log.info("claim write: %d replies for %d rows", len(replies), len(targets))
        except ServerError as err:  # maybe applied: the verification read decides
            log.warning("claim write outcome unknown (%s); verifying by reading back", err)

        confirmed: dict[str, Row] = {}
        must_read = replies is None or bool(bad) or self.always_verify
        if replies is not None:
            position = iter(replies)
            for token, guarded in layout:
                claimed = _occurrences(next(position, {})) == 1
                held = guarded and _occurrences(next(position, {})) == 1
                if claimed and held:
                    confirmed[token] = issued[token]
                elif claimed:  # our token landed on a row that no longer has the URL we read
                    must_read = True
        if must_read:
            verified = self.snapshot()
            found = {t: rows for t, rows in verified.by_token().items() if t in issued}
            mine = {t: rows[0] for t, rows in found.items()}
            extra = [(t, r) for t, rows in found.items() for r in rows[1:]]
            if extra:  # only possible if something repeated our exact request body
                self._retoken(verified, extra)
        else:  # every claim confirmed in place by its guard: the first read is still the truth
            verified, mine = snapshot, confirmed
        if replies is None:
            result.recovered = len(mine)
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
        if rejects:
            assert verified.columns is not None
            self._write_cells(
                verified.columns,
                [(v.row.number, {"reason": v.reason}) for v in rejects.values()],
            )
            self._transition_many(
                verified.columns,
                [(t, Status.PROCESSING, v.status) for t, v in rejects.items() if v.status],
            )
            result.rejected = [
                Rejection(t, v.status, v.reason, v.row.number, v.row.url)
                for t, v in rejects.items()
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
        requests = [
            self._find_replace(
                self._cell(row.number, col),
                status_value(Status.PROCESSING, token),
                status_value(Status.PROCESSING, new_token(now, secrets.token_hex(5))),
            )
            for token, row in extra
        ]
        try:
            self.backoff.call(lambda: self.transport.batch_update(requests))
        except ServerError as err:
            log.warning("re-tokening duplicate claims failed (%s); sheet_reconcile will see them", err)

    # -- later writes, by token --------------------------------------------------------------------

    def _transition_many(self, columns: ColumnMap, moves: Iterable[tuple[str, Status, Status]]) -> list[bool]:
        moves = list(moves)
        if not moves:
            return []
        requests = [
            self._find_replace(
                self._status_column(columns), status_value(old, token), status_value(new, token)
            )
            for token, old, new in moves
        ]
        try:
            replies = self.backoff.call(lambda: self.transport.batch_update(requests))
            return [_occurrences(r) == 1 for r in replies]
        except ServerError:
            after = self.snapshot()
            return [any(r.status is new for r in after.rows_with_token(token)) for token, _old, new in moves]

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
        moved = self._transition_many(columns, [(token, old, new)])[0]
        if not moved and cached is not None:  # the editor may have moved the status column
            fresh = self.snapshot().columns
            if fresh is not None and fresh != cached:
                moved = self._transition_many(fresh, [(token, old, new)])[0]
        return moved

    def _write_cells(self, columns: ColumnMap, updates: list[tuple[int, dict[str, str]]]) -> None:
        data: list[tuple[str, list[list[str]]]] = []
        for row_number, fields in updates:
            for name, value in fields.items():
                if not columns.has(name):
                    continue
                cell = f"{a1_sheet(self.sheet)}!{column_letter(columns[name])}{row_number}"
                data.append((cell, [[value]]))
        if not data:
            return

        # RAW values are idempotent: repeating the request writes the same text
        self._idempotent(lambda: self.transport.write_values(data))

    def write_fields(self, token: str, fields: dict[str, str], attempts: int = 3) -> Row:
        """Write ``fields`` (column -> text, stored RAW, never as a formula) into the row of ``token``.

        Locates the row by token in a fresh read, writes, and reads back to check that the values
        sit beside the token; if rows moved in between, it tries again.

        :raises LookupError: no row carries the token.
        :raises RuntimeError: rows kept moving for ``attempts`` tries.
        """
        for _ in range(attempts):
            snapshot = self.snapshot()
            rows = snapshot.rows_with_token(token)
            if not rows or snapshot.columns is None:
                raise LookupError(f"no row carries claim token {token!r}")
            if all(rows[0].get(k) == v for k, v in fields.items() if snapshot.columns.has(k)):
                return rows[0]
            self._write_cells(snapshot.columns, [(rows[0].number, fields)])
            check = self.snapshot().rows_with_token(token)
            if check and all(check[0].get(k) == v for k, v in fields.items() if snapshot.columns.has(k)):
                return check[0]
            log.warning("rows moved while writing %s for %s; retrying", sorted(fields), token)
        raise RuntimeError(f"could not write {sorted(fields)} beside token {token!r}: rows kept moving")

    # -- audit -------------------------------------------------------------------------------------

    def audit(self, entries: list[dict[str, str]]) -> None:
        """Append entries (keys from :data:`AUDIT_HEADER`) to the audit tab, creating it if needed.

        ``values.append`` inserts after the last row server-side, so it needs no position.
        """
        if not entries:
            return
        self._ensure_audit_tab()
        rows = [[str(e.get(k, "")) for k in AUDIT_HEADER] for e in entries]

        def attempt() -> None:
            self.transport.append_values(a1_sheet(self.audit_sheet), rows)

        self.backoff.call(attempt)

    def _ensure_audit_tab(self) -> None:
        try:
            self.sheet_id(self.audit_sheet)
            return
        except KeyError:
            pass
        try:
            self.backoff.call(
                lambda: self.transport.batch_update(
                    [{"addSheet": {"properties": {"title": self.audit_sheet}}}]
                )
            )
        except Exception as err:  # another process added it first (400), or an ambiguous 5xx
            log.info("audit tab %r not added (%s); assuming it exists", self.audit_sheet, err)
            self._sheet_ids = None
            return
        self._sheet_ids = None
        self.backoff.call(lambda: self.transport.append_values(a1_sheet(self.audit_sheet), [AUDIT_HEADER]))

    def read_audit(self) -> list[dict[str, str]]:
        """The audit tab as dicts; empty if the tab does not exist yet."""
        try:
            self.sheet_id(self.audit_sheet)
        except KeyError:
            return []
        values = self._read([a1_sheet(self.audit_sheet)])[0]
        if not values:
            return []
        header = [str(h) for h in values[0]]
        return [{h: (str(r[i]) if i < len(r) else "") for i, h in enumerate(header)} for r in values[1:]]
