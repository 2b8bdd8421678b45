"""A row's last writes: its final fields and status, and the removal of its row anchor.

Every claim anchors its row with developer metadata (:mod:`onceflow.sheets.anchors`), and Google caps
the developer metadata a spreadsheet, and each of its sheets, may hold (30,000 characters each).
An anchor is only needed while the row is in flight, so it goes **in the same ``batchUpdate`` as
the row's final transition** (DONE, INVALID, DUPLICATE, FAILED, REJECTED): the metadata a queue holds is then
bounded by the rows in flight, not by the rows it ever claimed. :func:`sweep_anchors` removes the
anchors of rows that became final some other way (an editor's hand, a crash between the two
writes of an older onceflow, the resent copy of a claim) and of rows that no longer carry their
token.

Cost of :func:`finish_many`, for any number of rows: 1 read (the tab with its rows' anchors and
its id, one ``spreadsheets.get``) + 1 write of the fields (none when there are none or they are
there already) + 1 ``batchUpdate`` with every transition, anchor deletion and URL guard; 1 more
read when some transition or guard did not reply 1 (to tell "already moved" from "our resent
copy moved it", and to see the URL beside the move). :class:`Settling` is the same in steps, so
that a ``sheet_claim`` wake-up can plan it from the claim's own read and send its batch inside the
claim's ``batchUpdate`` (:mod:`onceflow.sheets.relay`).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from onceflow.sheets import anchors
from onceflow.sheets.anchored import AnchoredRows
from onceflow.sheets.model import FINAL_STATUSES, SETTLED_STATUSES, Status, make_row, status_value
from onceflow.sheets.retry import ServerError
from onceflow.sheets.tab import find_replace, occurrences

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from onceflow.sheets.model import ColumnMap, Row, Snapshot
    from onceflow.sheets.tab import QueueTab

log = logging.getLogger(__name__)

__all__ = ["FINAL_STATUSES", "SETTLED_STATUSES", "Finish", "Move", "Settling", "finish_many", "settle"]

#: one item to finish: (claim token, final status, fields to write first or ``None``)
Finish = tuple[str, Status, "dict[str, str] | None"]

#: one row to settle with the statuses it may be moved from: (token, new status, fields, olds)
Move = tuple[str, Status, "dict[str, str] | None", frozenset[Status]]


def finish_many(
    queue: QueueTab,
    items: Sequence[Finish],
    old: Status | Collection[Status] = Status.PROCESSING,
    *,
    same: Callable[[Row], bool] | None = None,
) -> list[bool]:
    """Write each row's fields, then move it ``old`` -> its final status and drop its anchor
    (NEEDS_REVIEW too, keeping the anchor: the reviewer's decision is written through it).

    Fields go first, through the anchor (it is gone after the transition), and only into a row
    still carrying the token in ``old``: a row another writer already finished keeps its cells.
    The transitions are the fenced ``findReplace``s of :meth:`~onceflow.sheets.tab.QueueTab.transition`, and each
    anchor's ``deleteDeveloperMetadata`` rides in the same atomic batch.

    :param items: (token, final status, fields) per row.
    :param old: the status each row must still be in, or several (DONE comes from PROCESSING or,
        after an approval, from NEEDS_REVIEW): one fenced ``findReplace`` per old status rides in
        the batch, and a row carries one status, so at most one of them applies.
    :param same: whether the row (as read through its anchor) is still the one the items were
        meant for (the write-back's article: an editor may have typed another URL into a row in
        flight); a row it refuses gets no fields, no transition and keeps its anchor.
    :return: per item, whether its row is now in its final status (also when an earlier,
        ambiguous attempt had moved it).
    :raises ValueError: a status that is neither final nor NEEDS_REVIEW.
    """
    olds = frozenset({old} if isinstance(old, Status) else old)
    if not olds:
        raise ValueError("finish_many needs at least one status to move from")
    return settle(queue, [(token, new, fields, olds) for token, new, fields in items], same=same)


def settle(
    queue: QueueTab, items: Sequence[Move], *, same: Callable[[Row], bool] | None = None
) -> list[bool]:
    """:func:`finish_many` with each row's own statuses to move from: one read (the tab with its
    rows' anchors, which brings the tab id too), one write of the fields, one ``batchUpdate``.

    :raises ValueError: a status that is neither final nor NEEDS_REVIEW.
    :raises LookupError: the tab has no header row.
    """
    if not items:
        return []
    settling = Settling.read(queue, items, same=same)
    settling.write_fields()
    requests = settling.requests()
    if not requests:
        return settling.outcome([])
    try:
        replies: list[dict[str, Any]] | None = queue.backoff.call(
            lambda: queue.transport.batch_update(requests)
        )
    except ServerError:  # maybe applied: the read-back decides
        replies = None
    return settling.outcome(replies)


class Settling:
    """Rows settled from one read of them: their fields first, through their anchors; then, in one
    atomic batch (:meth:`requests`, which a claim's ``batchUpdate`` may carry too), the fenced
    moves, the anchors' deletions and the URL guards; then :meth:`outcome`, which reads back only
    when a move or a guard did not answer 1.

    :param queue: the tab.
    :param columns: the header as read.
    :param anchored: per token, the rows anchored to it as read (a by-anchor read, or a read of
        the tab that brought the rows' anchors).
    :param items: (token, new status, fields, statuses it may move from) per row.
    :param same: whether a row is still the one its item was meant for (see :func:`finish_many`).
    """

    def __init__(
        self,
        queue: QueueTab,
        columns: ColumnMap,
        anchored: dict[str, list[Row]],
        items: Sequence[Move],
        *,
        same: Callable[[Row], bool] | None = None,
    ) -> None:
        for _, new, _, olds in items:
            if new not in SETTLED_STATUSES:
                raise ValueError(f"{new.value} is not a final status; use QueueTab.transition")
            if not olds:
                raise ValueError("a row needs at least one status to move from")
        self.queue = queue
        self.columns = columns
        self.anchored = anchored
        self.items = list(items)
        self.same = same
        self.refused: set[str] = set()
        #: the read-back the outcome took (or was given), for a caller with more to tell from it
        self.after: Snapshot | None = None
        self._layout: list[tuple[str, int]] = []  # per row moved: its token, how many moves it has
        self._deletions = 0
        self._guarded: list[str] = []

    @classmethod
    def read(
        cls,
        queue: QueueTab,
        items: Sequence[Move],
        *,
        same: Callable[[Row], bool] | None = None,
        snapshot: Snapshot | None = None,
    ) -> Settling:
        """Plan from ``snapshot`` when it brought the rows' anchors, else from one read of the tab
        with them (a ``spreadsheets.get``, which brings the tab id too), else from a by-anchor read.

        :raises LookupError: the tab has no header row.
        """
        tokens = [token for token, _, _, _ in items]
        if snapshot is None or snapshot.anchored(tokens) is None:
            snapshot = queue.snapshot(with_id=True)
        found = snapshot.anchored(tokens)
        columns = snapshot.columns
        if found is None:  # the read brought no row metadata: ask the anchors themselves
            columns, found = AnchoredRows(queue).rows(tokens)
        if columns is None:
            raise LookupError("the queue tab has no header row")
        return cls(queue, columns, found, items, same=same)

    def write_fields(self) -> None:
        """Each row's fields, through its anchor, into a row still carrying its token in a status
        it may move from (one ``values.batchUpdateByDataFilter`` for all; none when every value is
        there already). A row ``same`` refuses gets nothing; a row whose anchor is missing or on
        a row without the token takes the careful way (:meth:`AnchoredRows.write_fields`)."""
        by_anchor = AnchoredRows(self.queue)
        columns, same = self.columns, self.same
        quick: list[tuple[str, dict[str, str]]] = []
        olds_of = {token: olds for token, _, _, olds in self.items}
        for token, _new, fields, olds in self.items:
            wanted = {k: v for k, v in (fields or {}).items() if columns.has(k)}
            rows = self.anchored.get(token, [])
            if same is not None and rows and rows[0].token == token and not same(rows[0]):
                log.warning(
                    "row %s of %s is no longer the same item (%r): not finished",
                    rows[0].number,
                    token,
                    rows[0].url,
                )
                self.refused.add(token)
                continue
            if not wanted:
                continue
            if rows and all(r.token == token for r in rows):
                if rows[0].status in olds and any(rows[0].get(k) != v for k, v in wanted.items()):
                    quick.append((token, wanted))
                continue
            # no anchor, or one on a row that lost the token: the slow path settles the anchor first
            try:
                by_anchor.write_fields(token, wanted, check=_checker(token, olds, same))
            except _NotSame as err:
                log.warning("%s not finished (%s)", token, err)
                self.refused.add(token)
            except (LookupError, _MovedOn) as err:
                log.info("fields of %s not written (%s)", token, err)
        if quick:
            reply = by_anchor.write(columns, quick)
            for token, row in _written(reply, columns):
                if row.token != token:  # the anchor was on another row: write it the careful way
                    fields = dict(quick)[token]
                    log.warning(
                        "anchor of %s was on a row without it; writing %s again", token, sorted(fields)
                    )
                    try:
                        by_anchor.write_fields(token, fields, check=_checker(token, olds_of[token]))
                    except (LookupError, _MovedOn) as err:
                        log.info("fields of %s not written (%s)", token, err)

    def requests(self) -> list[dict[str, Any]]:
        """The batch: every fenced move (one per status a row may move from, in a fixed order, so
        a resent batch is the same batch), then the anchors' deletions, then the URL guards."""
        going = [item for item in self.items if item[0] not in self.refused]
        moves: list[tuple[str, Status, Status]] = []
        self._layout = []
        for token, new, _, olds in going:
            order = sorted(olds, key=lambda st: st.value)
            moves += [(token, was, new) for was in order]
            self._layout.append((token, len(order)))
        deletions = [anchors.delete(anchors.lookup(t)) for t, new, _, _ in going if new in FINAL_STATUSES]
        self._deletions = len(deletions)
        # the row read was the item's, but the editor may type another URL in before the move
        # lands: position-aimed guards in the same atomic batch say whether, at that moment, the
        # row there held the new status *and* the URL read (any 0 is settled by reading back)
        self._guarded = []
        guards: list[dict[str, Any]] = []
        if self.same is not None:
            for token, new, _, _ in going:
                rows = self.anchored.get(token, [])
                if rows and rows[0].token == token and rows[0].url:
                    self._guarded.append(token)
                    guards += _guards(self.queue, self.columns, rows[0], token, new)
        if not moves:
            return []
        return self.queue.moves(self.columns, moves) + deletions + guards

    def outcome(self, replies: list[dict[str, Any]] | None, after: Snapshot | None = None) -> list[bool]:
        """Per item, whether its row is now in its new status (also when an earlier, ambiguous
        attempt had moved it); a row whose move landed beside a URL that is no longer its item is
        put back in flight (:func:`_undo`) and counts as not moved.

        :param replies: the replies to :meth:`requests`, in order; ``None`` when the outcome is
            unknown (a 5xx, or a 400 that may follow an applied earlier copy).
        :param after: a read of the tab made after the batch (the claim's read-back, when the
            batch rode in a claim's), used instead of reading again.
        """
        settled: dict[str, bool] = {}
        position = 0
        for token, n in self._layout:
            settled[token] = replies is not None and any(
                occurrences(r) == 1 for r in replies[position : position + n]
            )
            position += n
        extra = (replies or [])[position:]
        held = _held(extra[self._deletions :], self._guarded)
        same = self.same
        unsure = {token for token, _ in self._layout if same is not None and token not in held}
        done = [settled.get(token, False) for token, _, _, _ in self.items]
        if all(settled.values()) and not unsure:
            return done
        # a 0 can be this very batch's resent copy (httplib2 resends a request whose reply was
        # lost) finding the row already moved by the first copy, and a 5xx says nothing: the
        # sheet decides
        self.after = after = after or self.queue.snapshot()
        was = {
            token: rows[0].status for token, rows in self.anchored.items() if rows and rows[0].token == token
        }
        out = []
        for ok, (token, new, fields, _) in zip(done, self.items, strict=True):
            now = [r for r in after.rows_with_token(token) if r.status is new]
            if token in unsure and now and same is not None and not same(now[0]):
                back = was.get(token) or Status.PROCESSING
                log.warning(
                    "row %s of %s now holds %r: %s undone", now[0].number, token, now[0].url, new.value
                )
                link = (fields or {}).get("published_url", "")
                _undo(self.queue, self.columns, now[0], token, new, back, link, anchor=new in FINAL_STATUSES)
                out.append(False)
                continue
            out.append(token not in self.refused and (ok or bool(now)))
        return out


def _guards(queue: QueueTab, columns: Any, row: Row, token: str, new: Status) -> list[dict[str, Any]]:
    """Two no-op ``findReplace``s at ``row``'s position (as read): its status cell holds ``new
    #token`` and its URL cell the URL read. Both replying 1 means the row carrying the token held
    that URL when the move was applied (tokens are unique: only its row can match)."""
    moved = status_value(new, token)
    return [
        find_replace(queue.cell(row.number, columns["status"]), moved, moved),
        find_replace(queue.cell(row.number, columns["url"]), row.url, row.url),
    ]


def _held(replies: Sequence[dict[str, Any]], guarded: Sequence[str]) -> set[str]:
    """The guarded tokens whose two guards both replied 1."""
    return {
        token
        for i, token in enumerate(guarded)
        if len(replies) >= 2 * i + 2 and all(occurrences(r) == 1 for r in replies[2 * i : 2 * i + 2])
    }


def _undo(
    queue: QueueTab,
    columns: Any,
    row: Row,
    token: str,
    new: Status,
    back: Status,
    link: str,
    tries: int = 3,
    *,
    anchor: bool = True,
) -> bool:
    """Put a row moved to ``new`` beside a URL that is no longer its article back in flight.

    One batch aimed at the row's position: ``<new> #token`` -> ``<back> #token`` (conditional), a
    fresh anchor at the same position (it lands on the row the move changed, as a claim's does)
    and the link cleared (conditional on being ours). If rows moved first, the move misses: the
    anchor goes again by its id and the row is read again. ``anchor=False``: the row kept its
    anchor (NEEDS_REVIEW), none is made.
    """
    for _ in range(tries):
        requests = [
            find_replace(
                queue.cell(row.number, columns["status"]),
                status_value(new, token),
                status_value(back, token),
            ),
        ]
        if anchor:
            requests.append(anchors.create(queue.sheet_id(), row.number, token))
        if link and columns.has("published_url"):
            requests.append(find_replace(queue.cell(row.number, columns["published_url"]), link, ""))
        send = functools.partial(queue.transport.batch_update, requests)
        try:
            replies = queue.backoff.call(send)
        except ServerError:
            replies = []
        if replies and occurrences(replies[0]) == 1:
            return True
        created = anchors.created_id(replies[1]) if anchor and len(replies) > 1 else None
        if created is not None:
            queue.cleanup([anchors.delete(anchors.by_id(created))])
        rows = [r for r in queue.snapshot().rows_with_token(token) if r.status is new]
        if not rows:
            return not replies  # a 5xx after apply moved it back (its anchor then adopted later)
        row = rows[0]
    log.error("row of %s could not be put back in flight; sheet_reconcile will see it", token)
    return False


class _MovedOn(Exception):
    """The row is no longer in the state the fields were meant for."""


class _NotSame(_MovedOn):
    """The row carries the token but is no longer the item it was claimed for."""


def _checker(
    token: str, olds: Collection[Status], same: Callable[[Row], bool] | None = None
) -> Callable[[Row], None]:
    """A ``write_fields`` check: the row still carries ``token`` in one of ``olds`` (and ``same``)."""

    def check(row: Row) -> None:
        if same is not None and row.token == token and not same(row):
            raise _NotSame(f"row {row.number} now holds {row.url!r}")
        if row.token != token or row.status not in olds:
            wanted = " or ".join(sorted(st.value for st in olds))
            raise _MovedOn(f"row {row.number} is {row.status_cell.raw!r}, not {wanted} #{token}")

    return check


def _written(reply: dict[str, Any], columns: Any) -> list[tuple[str, Row]]:
    """(token the filter named, row as written) for each range a ``batchUpdateByDataFilter`` wrote."""
    out = []
    for response in reply.get("responses", []):
        token = response.get("dataFilter", {}).get("developerMetadataLookup", {}).get("metadataValue")
        data = response.get("updatedData", {})
        values = data.get("values", [])
        number = anchors.row_number(data.get("range", response.get("updatedRange", ""))) or 0
        if token:
            out.append((str(token), make_row(columns, number, values[0] if values else [])))
    return out
