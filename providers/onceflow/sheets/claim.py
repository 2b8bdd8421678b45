"""The claim: K NEW rows in one read and one conditional write, settled by reading back.

1. **Read** the queue tab and its id in one ``spreadsheets.get`` and pick NEW rows.
2. **Claim** them in one ``spreadsheets.batchUpdate`` holding, per row, a ``findReplace`` aimed at
   the row's status cell with ``matchEntireCell`` and ``matchCase`` (the exact text we read ->
   ``PROCESSING #<token>``, a token unique to that request), a guard on its URL cell, and the row
   anchor ``onceflow.claim = <token>`` (same position, same atomic batch, so it lands on the row
   the claim changed). The server applies each request only if the cell still says what we read,
   so two claimers can never both turn the same cell into their token.
3. **Decide** from the replies; **read back** when a guard missed, a claim replied 0, or the
   outcome is unknown (a 5xx, a 400 that may follow an applied earlier copy): a claim is won iff
   its token is in the sheet, and the work is created for the URL *beside the token*, never for
   the row aimed at.
4. Rows won that turn out INVALID or DUPLICATE are returned as :class:`Rejection`: still
   ``PROCESSING #<token>``, anchored; their final status leaves through the ledger's outbox
   (:mod:`onceflow.sheets.wakeup`).

``docs/sheet-queue.md`` has the argument and its assumptions.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from onceflow.sheets import anchors
from onceflow.sheets.anchored import sweep_anchors
from onceflow.sheets.keys import article_run_conf, pipeline_run_id
from onceflow.sheets.model import Row, Snapshot, Status, new_token, status_value, token_time
from onceflow.sheets.retry import Refused, ServerError
from onceflow.sheets.tab import find_replace, occurrences
from onceflow.sheets.validation import classify_claimed, classify_new_rows

if TYPE_CHECKING:
    from onceflow.sheets.tab import QueueTab

log = logging.getLogger(__name__)


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


class RideAlong(Protocol):
    """Requests that ride in a claim's ``batchUpdate``, planned from the claim's own read (a
    ``sheet_claim`` wake-up's relay: :class:`onceflow.sheets.relay.RowWrites`), so that one read
    and one batch serve both. Only the first attempt's batch carries them; a refused batch tells
    them ``None``, then :meth:`alone`, and a retry of the claim goes without them."""

    def read(self, snapshot: Snapshot) -> None:
        """The claim's read (the tab with its id and its rows' anchors); write what must come
        before the batch now."""

    def requests(self) -> list[dict[str, Any]]:
        """The requests to send first in the batch (the same list on every call)."""

    def answer(self, replies: list[dict[str, Any]] | None) -> None:
        """Their replies, in order; ``None`` when the batch's outcome is unknown (a 5xx, a 400)."""

    def read_back(self, snapshot: Snapshot) -> None:
        """A read the claim made after the batch (to be used instead of reading again)."""

    def alone(self) -> None:
        """The batch they rode in was refused whole (a 400): send them in their own batch now,
        before the claim tries again without them (their anchor deletions make the room a claim
        refused at the metadata cap needs)."""


class Claimer:
    """The claim protocol on one queue tab.

    :param tab: the :class:`~onceflow.sheets.tab.QueueTab` claimed from.
    :param spread: pick claim targets at random among the first ``spread * limit`` NEW rows, so
        concurrent claimers rarely aim at the same cells; 1 means strictly first-come.
    :param rng: the random choice of targets (seeded in tests).
    :param always_verify: read back after every claim write, even when each claim's URL guard
        confirmed it in place (one more read per wake-up; drops the reliance on the per-request
        ``occurrencesChanged`` replies, see ``docs/sheet-queue.md``).
    """

    def __init__(
        self, tab: QueueTab, *, spread: int = 4, rng: random.Random | None = None, always_verify: bool = False
    ) -> None:
        self.tab = tab
        self.spread = max(1, spread)
        self.rng = rng or random.Random()
        self.always_verify = always_verify

    def pick_targets(self, snapshot: Snapshot, limit: int) -> tuple[list[Row], list[Row]]:
        """The NEW rows to claim (``limit`` at most, at random among the first ``spread * limit``)
        and the bad NEW rows to take for their verdict (``limit`` at most)."""
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

    def claim(self, limit: int, attempts: int = 3, *, ride: RideAlong | None = None) -> ClaimResult:
        """Claim up to ``limit`` NEW rows; also take (up to ``limit``) bad NEW rows for their verdict.

        Costs one read and one ``batchUpdate`` whatever ``limit`` and the sheet size, plus one
        verification read when the write's outcome is unknown, some row moved or bad rows were
        taken, and one write to drop the row anchors of lost claims. The bad rows' INVALID or
        DUPLICATE is not written here: they come back in :attr:`ClaimResult.rejected`.

        :param limit: most rows to claim for work.
        :param attempts: tries when the claim batch is refused (400) because rows were deleted
            under it so that an aimed-at row is past the end of the sheet; nothing was applied,
            so the claim starts again from a fresh read.
        :param ride: requests that ride in the first claim batch (:class:`RideAlong`: a relay
            settling rows in the same wake-up), planned from the claim's read.
        :return: the rows won (create their runs now) and the rows rejected.
        """
        before = Counter(self.tab.transport.calls)
        swept = False
        squeezed = False  # at the metadata cap: the bad rows to mark share the room with the good
        refusals = 0
        while True:
            try:
                result = self.claim_once(limit, squeezed=squeezed, ride=ride)
                result.requests = Counter(self.tab.transport.calls) - before
                return result
            except Refused as err:
                if ride is not None:
                    # it rode in the refused batch: it goes now in its own, and a retry goes
                    # without it. Before the retry: at the cap, the room the claim needs may be
                    # the room its anchor deletions free (a claim retried without them, with
                    # them still pending, found none, and every wake-up did the same)
                    ride.alone()
                ride = None
                if "developer metadata" in str(err).lower() and not swept:
                    # Google's cap on developer metadata: drop the anchors of rows no longer in
                    # flight (finished some other way), then try again
                    swept = True
                    removed = sweep_anchors(self.tab)
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

    def claim_once(self, limit: int, *, squeezed: bool = False, ride: RideAlong | None = None) -> ClaimResult:
        """One claim pass: read the tab, claim up to ``limit`` NEW rows in one conditional batch (with
        ``ride``'s requests first) and settle any outcome left unknown by reading back.

        :param limit: the most rows to claim.
        :param squeezed: a retry after a refusal at Google's metadata cap: bad rows take only the
            anchors the good ones leave (one anchor per target, at most ``limit`` in all).
        :param ride: requests riding in the batch (:class:`RideAlong`), planned from this read.
        :raises Refused: the batch was refused (400) and no earlier copy of it applied.
        """
        result = ClaimResult()
        snapshot = self.tab.snapshot(with_id=True)
        if ride is not None:
            ride.read(snapshot)  # plans from this read, and writes what must precede the batch
        if snapshot.columns is None or limit <= 0:
            return result
        good, bad = self.pick_targets(snapshot, limit)
        if squeezed:  # one anchor per target: at most ``limit`` of them in all
            bad = bad[: max(0, limit - len(good))]
        targets = good + bad
        if not targets:
            return result
        result.aimed = len(targets)
        issued: dict[str, Row] = {}  # token -> the row it was aimed at
        status_col, url_col = snapshot.columns["status"], snapshot.columns["url"]
        layout: list[tuple[str, bool]] = []  # per target: its token, whether a URL guard follows
        sheet_id = self.tab.sheet_id()
        # first in the batch: a relay's anchor deletions make room before the claim's anchors
        riding = ride.requests() if ride is not None else []

        def attempt() -> list[dict[str, Any]]:
            # fresh tokens on every attempt: one token can then match at most one cell, ever
            now = self.tab.clock()
            tokens = [new_token(now, secrets.token_hex(5), self.tab.version) for _ in targets]
            issued.update(zip(tokens, targets, strict=True))
            layout.clear()
            requests = []
            for i, (row, token) in enumerate(zip(targets, tokens, strict=True)):
                requests.append(
                    find_replace(
                        self.tab.cell(row.number, status_col),
                        row.status_cell.raw,
                        status_value(Status.PROCESSING, token),
                    )
                )
                # the guard: the same row's URL cell must still hold the URL we read; applied in the
                # same atomic batch, so both replies describe one row at one moment
                guarded = i < len(good)
                if guarded:
                    requests.append(find_replace(self.tab.cell(row.number, url_col), row.url, row.url))
                # the row anchor: same position, same atomic batch, so it lands on the row whose
                # status cell the claim changed (if it changed one); later writes go through it
                requests.append(anchors.create(sheet_id, row.number, token))
                layout.append((token, guarded))
            return self.tab.transport.batch_update(riding + requests)

        replies: list[dict[str, Any]] | None = None
        refusal: Refused | None = None
        try:
            replies = self.tab.backoff.call(attempt)
            if ride is not None:
                ride.answer(replies[: len(riding)])
                replies = replies[len(riding) :]
            log.info("claim write: %d replies for %d rows", len(replies), len(targets))
        except ServerError as err:  # maybe applied: the verification read decides
            if ride is not None:
                ride.answer(None)
            log.warning("claim write outcome unknown (%s); verifying by reading back", err)
        except Refused as err:
            if ride is not None:
                ride.answer(None)
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
                claimed = occurrences(next(position, {})) == 1
                held = guarded and occurrences(next(position, {})) == 1
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
        doubled: list[int] = []
        if must_read:
            # an unknown outcome may hide two applied copies (a resend whose reply was lost too):
            # then read the rows' anchors with the values (one spreadsheets.get, as the claim's read)
            verified = self.tab.snapshot(with_id=replies is None)
            if ride is not None:
                ride.read_back(verified)
            found = {t: rows for t, rows in verified.by_token().items() if t in issued}
            mine = {t: rows[0] for t, rows in found.items()}
            doubled = verified.extra_anchors(mine)
            extra = [(t, r) for t, rows in found.items() for r in rows[1:]]
            if extra:  # only possible if something repeated our exact request body
                self.retoken(verified, extra)
                # the re-token is a conditional write aimed at a position: rows may have moved
                # under it, so which row kept the token is read, never assumed; a token still on
                # several rows is handed out to none (sheet_reconcile drives those rows)
                verified = self.tab.snapshot()
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
        # ... and when both copies' replies were lost, the extra anchors the read-back shows
        stray += [anchors.delete(anchors.by_id(i)) for i in doubled if i not in unapplied.values()]
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
                        run_id=pipeline_run_id(verdict.key, self.tab.version),
                        row_number=verdict.row.number,
                        claimed_at=token_time(token) or self.tab.clock(),
                    )
                )
        if stray:
            self.tab.cleanup(stray)
        # INVALID and DUPLICATE leave the way every final status does, through the outbox: the
        # rows stay PROCESSING #token, anchored, until the caller's relay writes them
        result.rejected = [
            Rejection(t, v.status, v.reason, v.row.number, v.row.url, v.key)
            for t, v in sorted(rejects.items(), key=lambda tv: tv[1].row.number)
            if v.status
        ]
        result.lost = len(targets) - len(mine)
        return result

    def retoken(self, snapshot: Snapshot, extra: list[tuple[str, Row]]) -> None:
        """Give second and later rows carrying one token a fresh token of their own.

        Each request is aimed at one cell and matches only our own token, so even if the row has
        moved it cannot touch anyone else's cell; a missed one is left to ``sheet_reconcile``.
        """
        assert snapshot.columns is not None
        col = snapshot.columns["status"]
        now = self.tab.clock()
        requests = []
        for token, row in extra:
            fresh = new_token(now, secrets.token_hex(5), self.tab.version)
            requests.append(
                find_replace(
                    self.tab.cell(row.number, col),
                    status_value(Status.PROCESSING, token),
                    status_value(Status.PROCESSING, fresh),
                )
            )
            requests.append(anchors.create(self.tab.sheet_id(), row.number, fresh))
        # the old token's anchors on those rows are found and dropped by write_fields (by id)
        try:
            self.tab.backoff.call(lambda: self.tab.transport.batch_update(requests))
        except ServerError as err:
            log.warning("re-tokening duplicate claims failed (%s); sheet_reconcile will see them", err)
