"""The article chain's writes to its sheet row: DONE, NEEDS_REVIEW, REJECTED, FAILED.

The chain itself commits these to the ledger's outbox (the ``*_fields`` here are their cells) and
:mod:`onceflow.sheets.relay` writes them; the ``write_*`` functions write one row directly (an
article published before the outbox, tests, tools).

Every write finds the row by its claim token, through the row anchor the claim made (an editor may
have inserted, deleted or sorted rows since), stores values RAW (a title or note starting with
``=``, ``+``, ``-`` or ``@`` stays text, never a formula), and moves the status with the fenced
``findReplace`` ``<OLD> #<token>`` -> ``<NEW> #<token>``, which applies only while the row is still
ours and still in the expected state. A final status (DONE, REJECTED, FAILED) removes the row's
anchor in the same batch; NEEDS_REVIEW keeps it, because the reviewer's decision is written
through it later.

Each function returns whether the row is now in the new status (also when an earlier attempt, e.g.
the try before a crash, had moved it), and ``False`` when the row no longer carries the token in
the expected state (an editor deleted it, the reconciler gave it up): nothing is written then.

Sheets requests (counted with the emulator's request log, ``tests/integration/test_article_writeback.py``):
:func:`write_done`, :func:`write_rejected`, :func:`write_failed`: 1 read + 2 writes;
:func:`write_needs_review`: 1 read + 2 writes. See ``docs/articles.md#write-back-and-statuses``
for why the field write and the status move cannot be one request.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from onceflow.sheets.model import Status

if TYPE_CHECKING:
    from collections.abc import Collection

    from onceflow.sheets.model import Row
    from onceflow.sheets.protocol import SheetQueue

log = logging.getLogger(__name__)

#: longest reason written to a cell (Google allows 50,000 characters; a row stays readable)
MAX_REASON = 1000


def format_score(score: float) -> str:
    """``0.8734`` -> ``"0.87"``.

    :raises ValueError: not a finite number.
    """
    value = float(score)
    if not math.isfinite(value):
        raise ValueError(f"score must be a finite number, got {score!r}")
    return f"{value:.2f}"


def _reason(text: str, what: str) -> str:
    cleaned = " ".join(str(text).split())  # one line: a cell, not a log
    if not cleaned:
        raise ValueError(f"{what} must not be empty")
    return cleaned if len(cleaned) <= MAX_REASON else cleaned[: MAX_REASON - 1] + "…"


def write_done(
    queue: SheetQueue,
    token: str,
    *,
    score: float,
    published_url: str,
    run_id: str,
    row_key: str | None = None,
    reason: str | None = None,
) -> bool:
    """The row of ``token``: score, link and run id, then DONE with its anchor removed.

    :param reason: replaces the row's reason (after a review: who approved it).

    From PROCESSING, or from NEEDS_REVIEW after a reviewer approved: both fenced moves ride in the
    one ``batchUpdate``, and the row carries one status, so at most one applies.
    Costs 1 read + 2 writes (:meth:`SheetQueue.finish`).

    :param row_key: the article that was published: a row whose URL the editor changed to another
        article while it was in flight is left as it is (still PROCESSING or NEEDS_REVIEW, its
        anchor kept), never DONE with the old article's link; ``sheet_reconcile`` then runs it
        for its new URL under the same claim.
    """
    from onceflow.sheets.validation import judge_url

    fields = done_fields(score=score, published_url=published_url, run_id=run_id)
    if reason:
        fields["reason"] = _reason(reason, "reason")
    same = None if row_key is None else (lambda row: judge_url(row).key == row_key)
    return queue.finish(token, Status.DONE, fields, old=(Status.PROCESSING, Status.NEEDS_REVIEW), same=same)


def done_fields(
    *, score: float, published_url: str, run_id: str, approved_by: str | None = None
) -> dict[str, str]:
    """The cells a DONE row gets: score, link, run id, and who approved it after a review."""
    fields = {"score": format_score(score), "published_url": published_url, "run_id": run_id}
    if approved_by:
        fields["reason"] = _reason(f"approved in review by {approved_by}", "reason")
    return fields


def write_needs_review(queue: SheetQueue, token: str, *, score: float, reason: str) -> bool:
    """The row of ``token``: score and why it needs review, then PROCESSING -> NEEDS_REVIEW.

    The anchor stays (not final). Costs 1 read + 2 writes: the read (through the anchor, which also
    gives the header) checks the row is ours and still PROCESSING, the fields go through the
    anchor, the status moves in one fenced ``findReplace``. A repeat after the move reads 1 and
    writes nothing.
    """
    fields = needs_review_fields(score=score, reason=reason)
    return _move_keeping_anchor(queue, token, fields, Status.PROCESSING, Status.NEEDS_REVIEW)


def needs_review_fields(*, score: float, reason: str) -> dict[str, str]:
    """The cells a NEEDS_REVIEW row gets: score and why it needs review."""
    return {"score": format_score(score), "reason": _reason(reason, "reason")}


def rejected_fields(*, note: str, score: float) -> dict[str, str]:
    """The cells a REJECTED row gets: score, and the reviewer's note as its reason."""
    reason = _reason(note, "note") if str(note).strip() else "rejected by the reviewer (no note given)"
    return {"score": format_score(score), "reason": reason}


def failed_fields(reason: str) -> dict[str, str]:
    """The cell a FAILED row gets: the failure's reason, on one line."""
    return {"reason": _reason(reason, "reason")}


def write_rejected(queue: SheetQueue, token: str, *, note: str, score: float) -> bool:
    """The row of ``token``: the reviewer's note as its reason, then NEEDS_REVIEW -> REJECTED with
    its anchor removed. Costs 1 read + 2 writes."""
    fields = rejected_fields(note=note, score=score)
    return queue.finish(token, Status.REJECTED, fields, old=Status.NEEDS_REVIEW)


def write_failed(
    queue: SheetQueue, token: str, *, reason: str, old: Status | Collection[Status] = Status.PROCESSING
) -> bool:
    """The row of ``token``: a permanent failure's reason, then ``old`` -> FAILED with its anchor
    removed. Costs 1 read + 2 writes.

    :param old: the status the row must be in; several (``(PROCESSING, NEEDS_REVIEW)``) ride as
        one fenced ``findReplace`` each in the same batch, at no extra cost.
    """
    return queue.finish(token, Status.FAILED, failed_fields(reason), old=old)


class _NotInState(Exception):
    """The row no longer carries the token in a state this write may follow."""


def _move_keeping_anchor(
    queue: SheetQueue, token: str, fields: dict[str, str], old: Status, new: Status
) -> bool:
    """``fields`` through the anchor, then the fenced ``old`` -> ``new``; the anchor stays."""

    def check(row: Row, allowed: Collection[Status] = (old, new)) -> None:
        if row.token != token or row.status not in allowed:
            raise _NotInState(f"row {row.number} is {row.status_cell.raw!r}, not {old.value} #{token}")

    try:
        row = queue.write_fields(token, fields, check=check)
    except (LookupError, _NotInState) as err:
        log.info("%s of %s not written (%s)", new.value, token, err)
        return False
    if row.status is new:  # an earlier attempt moved it; its fields are now written too
        return True
    columns = queue.columns  # the header the write_fields read just saw
    if columns is None:
        return False
    if queue.transition_many(columns, [(token, old, new)])[0]:
        return True
    # 0: moved by our own resent copy, or by someone else meanwhile: the sheet decides
    return any(r.status is new for r in queue.snapshot().rows_with_token(token))
