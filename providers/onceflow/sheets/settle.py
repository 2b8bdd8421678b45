"""A row's last writes: its final fields and status, and the removal of its row anchor.

Every claim anchors its row with developer metadata (:mod:`onceflow.sheets.anchors`), and Google caps
the developer metadata a spreadsheet, and each of its sheets, may hold (30,000 characters each).
An anchor is only needed while the row is in flight, so it goes **in the same ``batchUpdate`` as
the row's final transition** (DONE, INVALID, DUPLICATE, FAILED, REJECTED): the metadata a queue holds is then
bounded by the rows in flight, not by the rows it ever claimed. :func:`sweep_anchors` removes the
anchors of rows that became final some other way (an editor's hand, a crash between the two
writes of an older onceflow, the resent copy of a claim) and of rows that no longer carry their
token.

Cost of :func:`finish_many`, for any number of rows: 1 read (header and every anchored row, by
their anchors) + 1 write of the fields (none when there are none or they are there already) + 1
``batchUpdate`` with every transition and anchor deletion; 1 more read when some transition
replied 0 (to tell "already moved" from "our resent copy moved it").
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

    from onceflow.sheets.model import Row
    from onceflow.sheets.tab import QueueTab

log = logging.getLogger(__name__)

__all__ = ["FINAL_STATUSES", "SETTLED_STATUSES", "Finish", "finish_many"]

#: one item to finish: (claim token, final status, fields to write first or ``None``)
Finish = tuple[str, Status, "dict[str, str] | None"]


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
    if not items:
        return []
    for _, new, _ in items:
        if new not in SETTLED_STATUSES:
            raise ValueError(f"{new.value} is not a final status; use QueueTab.transition")
    olds = frozenset({old} if isinstance(old, Status) else old)
    if not olds:
        raise ValueError("finish_many needs at least one status to move from")
    by_anchor = AnchoredRows(queue)
    columns, anchored = by_anchor.rows([token for token, _, _ in items])
    if columns is None:
        raise LookupError("the queue tab has no header row")
    quick: list[tuple[str, dict[str, str]]] = []
    refused: set[str] = set()
    for token, _new, fields in items:
        wanted = {k: v for k, v in (fields or {}).items() if columns.has(k)}
        rows = anchored.get(token, [])
        if same is not None and rows and rows[0].token == token and not same(rows[0]):
            log.warning(
                "row %s of %s is no longer the same item (%r): not finished",
                rows[0].number,
                token,
                rows[0].url,
            )
            refused.add(token)
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
            refused.add(token)
        except (LookupError, _MovedOn) as err:
            log.info("fields of %s not written (%s)", token, err)
    if quick:
        reply = by_anchor.write(columns, quick)
        for token, row in _written(reply, columns):
            if row.token != token:  # the anchor was on another row: write it the careful way
                fields = dict(quick)[token]
                log.warning("anchor of %s was on a row without it; writing %s again", token, sorted(fields))
                try:
                    by_anchor.write_fields(token, fields, check=_checker(token, olds))
                except (LookupError, _MovedOn) as err:
                    log.info("fields of %s not written (%s)", token, err)
    order = sorted(olds, key=lambda st: st.value)  # a fixed order: a resent batch is the same batch
    going = [item for item in items if item[0] not in refused]
    moves = [(token, was, new) for token, new, _ in going for was in order]
    deletions = [anchors.delete(anchors.lookup(token)) for token, new, _ in going if new in FINAL_STATUSES]
    # the row read above was the item's, but the editor may type another URL in before the move
    # lands: position-aimed guards in the same atomic batch say whether, at that moment, the row
    # there held the new status *and* the URL read (any 0 is settled by reading back, below)
    guarded: list[str] = []
    guards: list[dict[str, Any]] = []
    if same is not None:
        for token, new, _ in going:
            rows = anchored.get(token, [])
            if rows and rows[0].token == token and rows[0].url:
                guarded.append(token)
                guards += _guards(queue, columns, rows[0], token, new)
    replies: list[dict[str, Any]] = []
    moved = (
        queue.transition_many(columns, moves, extra=deletions + guards, extra_replies=replies)
        if going
        else []
    )
    settled = {
        token: any(moved[i * len(order) : (i + 1) * len(order)]) for i, (token, _, _) in enumerate(going)
    }
    held = _held(replies[len(deletions) :], guarded)
    unsure = {token for token, _, _ in going if same is not None and token not in held}
    done = [settled.get(token, False) for token, _, _ in items]
    if all(settled.values()) and not unsure:
        return done
    # a 0 can be this very batch's resent copy (httplib2 resends a request whose reply was lost)
    # finding the row already moved by the first copy: the sheet decides
    after = queue.snapshot()
    was = {token: rows[0].status for token, rows in anchored.items() if rows and rows[0].token == token}
    out = []
    for ok, (token, new, fields) in zip(done, items, strict=True):
        now = [r for r in after.rows_with_token(token) if r.status is new]
        if token in unsure and now and same is not None and not same(now[0]):
            back = was.get(token) or Status.PROCESSING
            log.warning("row %s of %s now holds %r: %s undone", now[0].number, token, now[0].url, new.value)
            link = (fields or {}).get("published_url", "")
            _undo(queue, columns, now[0], token, new, back, link, anchor=new in FINAL_STATUSES)
            out.append(False)
            continue
        out.append(token not in refused and (ok or bool(now)))
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
