"""The sheet relay: row write-backs committed to the ledger's outbox, written to the sheet in batches.

Every status the article chain gives a row leaves this way: a step that finishes a row
(``publish``: DONE, link, score) commits its result and a ``sheet_row`` follow-up, "row of claim T
on sheet S: DONE with these fields", in **one ledger transaction**
(:meth:`~onceflow.ledger.core.Ledger.commit_result`); a permanent step failure commits the row's
FAILED with the item's ``needs_correction`` (:meth:`~onceflow.ledger.core.Ledger.mark_invalid`);
``mark_needs_review`` (NEEDS_REVIEW, the anchor kept) and a reviewer's rejection (REJECTED) are
ledger steps that commit theirs with their result. So

* a try whose lease was taken over cannot reach the sheet: its commit is refused, and with it its
  write-back;
* a crash between the commit and the sheet write loses nothing: the row waits in the outbox, and the
  next relay pass (the chain's ``write_back`` task, its Airflow retry, ``sheet_claim``'s next
  wake-up) writes it;
* a crash after the sheet write and before the outbox row is marked repeats nothing: the second
  pass finds the row already final (its fenced ``findReplace`` matches nothing, the read-back
  sees the status), writes no field, and marks the outbox row.

:func:`relay_sheet_rows` settles every pending row of a sheet at once (:class:`RowWrites`, on
:class:`onceflow.sheets.settle.Settling`): **1 read + 2 writes per sheet and pass, whatever the
number of rows** (one ``spreadsheets.get`` of the tab: its id, its rows and their anchors; the
fields through the anchors; every fenced status move, URL guard and anchor deletion in one
``spreadsheets.batchUpdate``), +1 read when some move or guard did not reply 1. In a
``sheet_claim`` wake-up the pass rides in the claim (:mod:`onceflow.sheets.wakeup`): the claim's
read is its read and its batch goes first in the claim's ``batchUpdate``, so it adds one write. A
row is
finished only while its URL still names the article that was published (``row_key``): an editor's
new URL, typed before the read or between the read and the batch, is never left DONE with the old
link (``finish_many``'s guards put it back in flight, and ``sheet_reconcile`` runs the new URL).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.sheets import settle
from onceflow.sheets.model import Status, status_value
from onceflow.sheets.retry import ServerError
from onceflow.sheets.validation import judge_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import FollowUp
    from onceflow.ledger.outbox import OutboxRow
    from onceflow.sheets.model import Row, Snapshot
    from onceflow.sheets.tab import QueueTab

log = logging.getLogger(__name__)

#: what a pass takes at most from the outbox
DEFAULT_LIMIT = 200


def sheet_target(spreadsheet_id: str, sheet: str) -> str:
    """The outbox target of a sheet queue: ``<spreadsheet id>/<tab>`` (an id has no ``/``)."""
    if not spreadsheet_id or "/" in spreadsheet_id:
        raise ValueError(f"not a spreadsheet id: {spreadsheet_id!r}")
    return f"{spreadsheet_id}/{sheet}"


def queue_target(queue: QueueTab) -> str:
    """The outbox target of ``queue``'s tab."""
    return sheet_target(str(getattr(queue.transport, "spreadsheet_id", "")), queue.sheet)


def row_write(
    target: str,
    token: str,
    status: Status,
    fields: dict[str, str],
    *,
    old: Sequence[Status] = (Status.PROCESSING, Status.NEEDS_REVIEW),
    row_key: str | None = None,
    url: str | None = None,
    key: str | None = None,
) -> FollowUp:
    """The follow-up that moves the row of claim ``token`` on ``target`` to ``status`` with ``fields``.

    :param old: the statuses the row may be in (each a fenced ``findReplace`` in the batch).
    :param row_key: the article the write is for: a row whose URL now names another is not finished.
    :param url: the URL cell's text the write was decided on (an INVALID row has no article): a row
        whose URL the editor has since changed is not finished.
    :param key: the outbox row's own key, for a write no lease commits (:func:`rejection_write`).
    :raises ValueError: ``status`` is neither final nor NEEDS_REVIEW (the one move in flight the
        relay makes, keeping the row's anchor).
    """
    from onceflow.ledger.models import FollowUp

    if status not in settle.SETTLED_STATUSES:
        raise ValueError(f"{status.value} is not a final status")
    payload = {
        "token": token,
        "status": status.value,
        "fields": dict(fields),
        "old": sorted(st.value for st in old),
        "row_key": row_key,
    }
    if url is not None:
        payload["url"] = url
    return FollowUp.sheet_row(target, payload, key)


def claim_work_key(token: str) -> str:
    """The work key the outbox files a row write under when no lease commits it: the claim's."""
    return f"claim:{token}"


def decided_write(
    target: str,
    token: str,
    status: Status,
    reason: str,
    *,
    url: str | None,
    row_key: str | None,
    old: Sequence[Status] = (Status.PROCESSING,),
    key: str = "",
) -> FollowUp:
    """A final status no lease commits, with its reason, for the outbox: a claim's INVALID or
    DUPLICATE, ``sheet_reconcile``'s INVALID, DUPLICATE or FAILED. It moves the row only from
    ``old`` and only while the row is still the one judged: its URL cell still ``url`` (an INVALID
    row's, which names no article), or still naming the article ``row_key``.

    :param key: what makes the outbox row unique beside the token and status (``sheet_reconcile``
        passes its pass time; a claim's token is fresh, so a claim passes none).
    """
    if status not in settle.FINAL_STATUSES:
        raise ValueError(f"{status.value} is not a final status")
    unique = ":".join(part for part in (token, status.value, key) if part)
    return row_write(target, token, status, {"reason": reason}, old=old, row_key=row_key, url=url, key=unique)


def claim_writes(ledger: Ledger, work_key: str, token: str) -> list[str]:
    """The states (``pending``, ``relayed``) of the outbox writes of claim ``token``'s row."""
    import json

    import sqlalchemy as sa

    from onceflow.ledger import schema
    from onceflow.ledger.models import SHEET_ROW

    o = schema.outbox.c
    stmt = sa.select(o.state, o.payload).where(o.work_key == work_key, o.target_type == SHEET_ROW)
    with ledger.engine.connect() as conn:
        found = conn.execute(stmt).all()
    return [
        state for state, payload in found if json.loads(payload or "{}").get("data", {}).get("token") == token
    ]


@dataclass
class SheetRelayReport:
    """One pass: outbox rows settled, the claim tokens written or left alone, and errors."""

    relayed: int = 0
    #: tokens whose row is now in the status the outbox asked for (also when an earlier pass moved it)
    written: list[str] = field(default_factory=list)
    #: tokens whose row was not in a state to move (removed, finished otherwise, its URL changed)
    left: list[str] = field(default_factory=list)
    #: tokens whose row is still waiting for its move (a 5xx, a quota refusal): left pending
    waiting: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Sheets requests per API method, over every sheet of the pass
    requests: Counter[str] = field(default_factory=Counter)
    #: tokens whose write :func:`send_rows` committed to the outbox before relaying (written
    #: now, or by the next pass)
    committed: list[str] = field(default_factory=list)


def relay_sheet_rows(
    ledger: Ledger,
    open_queue: Callable[[str, str], QueueTab],
    *,
    target: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> SheetRelayReport:
    """Write the pending ``sheet_row`` follow-ups (of ``target``, or of every sheet) to their sheets.

    :param open_queue: ``(spreadsheet id, tab) -> QueueTab`` (one per sheet and pass).
    An outbox row is marked relayed once its sheet answered (written, or not in a state to be);
    a sheet that failed (5xx, quota, no header) leaves its rows pending with the error recorded.
    """
    from onceflow.ledger import outbox

    report = SheetRelayReport()
    by_sheet: dict[str, list[OutboxRow]] = {}
    for row in outbox.pending_sheet_rows(ledger, target, limit):
        by_sheet.setdefault(row.target, []).append(row)
    for sheet, rows in by_sheet.items():
        spreadsheet_id, _, tab = sheet.partition("/")
        opened: list[QueueTab] = []
        outcome = functools.partial(_open_and_settle, open_queue, (spreadsheet_id, tab), rows, opened)
        try:
            record(ledger, sheet, rows, outcome, report)
        finally:
            for queue in opened:
                report.requests.update(queue.transport.calls)
    return report


def _open_and_settle(
    open_queue: Callable[[str, str], QueueTab],
    where: tuple[str, str],
    rows: Sequence[OutboxRow],
    opened: list[QueueTab],
) -> dict[str, bool | None]:
    opened.append(open_queue(*where))
    return RowWrites(opened[-1], [row.data for row in rows]).outcome()


def record(
    ledger: Ledger,
    sheet: str,
    rows: Sequence[OutboxRow],
    outcome: Callable[[], dict[str, bool | None]],
    report: SheetRelayReport,
) -> None:
    """Settle ``rows`` of ``sheet`` (``outcome``: per token, written, left, or still waiting) and
    mark in the outbox those the sheet answered; the rest stay pending with the error recorded."""
    from onceflow.ledger import outbox

    try:
        found = outcome()
    except Exception as exc:  # recorded on the rows; the next pass tries again
        error = f"{type(exc).__name__}: {exc}"
        log.warning("sheet %s: %d write-back(s) not relayed: %s", sheet, len(rows), error)
        outbox.mark_failed_delivery(ledger, [row.id for row in rows], error)
        report.errors.append(f"{sheet}: {error}")
        return
    waiting = [token for token, ok in found.items() if ok is None]
    for token, ok in found.items():
        (report.written if ok else report.waiting if ok is None else report.left).append(token)
    done = [row.id for row in rows if found.get(str(row.data.get("token"))) is not None]
    report.relayed += outbox.mark_relayed(ledger, done)
    if waiting:
        error = f"not applied, the rows still wait for it: {sorted(waiting)}"
        outbox.mark_failed_delivery(ledger, [row.id for row in rows if row.id not in done], error)
        report.errors.append(f"{sheet}: {error}")


def send_rows(
    queue: QueueTab, ledger: Ledger | None, step: str, writes: Sequence[FollowUp]
) -> SheetRelayReport:
    """Commit row writes that no lease commits (:func:`decided_write`) to the outbox, filed under
    their claims, then relay the queue's pending rows, these among them.

    The commit comes first, so a process that dies before or inside the relay loses nothing: the
    rows wait in the outbox for the next pass (``sheet_claim``'s next wake-up). Without a ledger
    the writes are settled at once, as a relay pass would (nothing durable between the decision
    and the sheet: a crash leaves the rows PROCESSING, for ``sheet_reconcile``).
    """
    if not writes:
        return SheetRelayReport()
    if ledger is not None:
        ledger.enqueue(step, [(claim_work_key(str(w.payload["token"])), w) for w in writes])
        report = relay_sheet_rows(ledger, lambda _sid, _tab: queue, target=queue_target(queue))
        report.committed = [str(w.payload["token"]) for w in writes]
        return report
    report = SheetRelayReport()
    before = Counter(queue.transport.calls)
    try:
        outcome = settle_rows(queue, [w.payload for w in writes])
    except Exception as exc:  # the rows stay PROCESSING: sheet_reconcile finishes them after the lease
        report.errors.append(f"{queue_target(queue)}: {type(exc).__name__}: {exc}")
        outcome = {}
    finally:
        report.requests.update(Counter(queue.transport.calls) - before)
    for token, ok in outcome.items():
        (report.written if ok else report.waiting if ok is None else report.left).append(token)
    return report


def settle_rows(queue: QueueTab, writes: Sequence[Mapping[str, Any]]) -> dict[str, bool | None]:
    """Each write's row moved to its status with its fields, in one pass (:class:`RowWrites`): 1
    read (the tab with its id and rows' anchors) + 2 writes (the fields; every move, URL guard and
    anchor deletion in one ``batchUpdate``), +1 read when some move or guard did not answer 1."""
    return RowWrites(queue, writes).outcome()


class RowWrites:
    """A sheet's pending row writes, settled in one pass: planned from one read of the tab (its
    own, or the claim's when it rides in a ``sheet_claim`` wake-up), the fields written first, then
    the fenced moves, URL guards and anchor deletions in one batch (alone, or first in the claim's
    ``batchUpdate``: it implements :class:`onceflow.sheets.claim.RideAlong`).

    Writes of one token after the first are the same article's later commits, oldest first
    (NEEDS_REVIEW, then the reviewer's REJECTED or the approved DONE): the newest wins, and may
    also move the row from where the older ones started when none of them reached the sheet yet
    (PROCESSING -> REJECTED when the NEEDS_REVIEW before it is pending too). Each row's moves are
    one fenced ``findReplace`` per status it may come from, all rows in one batch.

    :meth:`outcome` gives, per token, whether its row now is in its status, or ``None`` when its
    row still waits for the move in the state it was asked from (the batch was not applied: a
    5xx, a quota refusal), so the write stays pending. Telling that apart from "not in a state to
    move" takes a read after the batch, only when some move did not happen.
    """

    def __init__(self, queue: QueueTab, writes: Sequence[Mapping[str, Any]]) -> None:
        self.queue = queue
        latest: dict[str, dict[str, Any]] = {}
        for w in writes:
            token, olds = str(w["token"]), list(w.get("old") or (Status.PROCESSING.value,))
            before = latest.get(token)
            if before is not None and before["status"] in olds:  # the older write leads into this one
                olds = sorted({*olds, *before["old"]})
            latest[token] = {
                **w,
                "old": olds,
                "fields": {**(before or {}).get("fields", {}), **(w.get("fields") or {})},
            }
        self.latest = latest
        self._keys = {token: (w.get("row_key"), w.get("url")) for token, w in latest.items()}
        self.items: list[settle.Move] = [
            (token, Status(w["status"]), dict(w["fields"]), frozenset(Status(v) for v in w["old"]))
            for token, w in latest.items()
        ]
        self.settling: settle.Settling | None = None
        self._requests: list[dict[str, Any]] = []
        self._replies: list[dict[str, Any]] | None = None
        self._sent = False
        self._after: Snapshot | None = None
        self._error: Exception | None = None

    def same(self, row: Row) -> bool:
        """Whether ``row`` is still the one its write was meant for (its article, or its URL)."""
        key, url = self._keys.get(row.token or "", (None, None))
        if url is not None and row.url != url:
            return False
        return key is None or judge_url(row).key == key

    # -- riding in a claim's batch (onceflow.sheets.claim.RideAlong) -------------------------------

    def read(self, snapshot: Snapshot | None) -> None:
        """Plan from ``snapshot`` (read now when ``None``, or when it lacks the rows' anchors) and
        write the fields. An error is kept for :meth:`outcome`: it must not stop the claim."""
        try:
            self.settling = settle.Settling.read(self.queue, self.items, same=self.same, snapshot=snapshot)
            self.settling.write_fields()
            self._requests = self.settling.requests()
        except Exception as exc:
            log.warning("row writes not planned (%s); they wait for the next pass", exc)
            self.settling, self._requests, self._error = None, [], exc

    def requests(self) -> list[dict[str, Any]]:
        """The batch's requests (empty when there is nothing to move)."""
        return self._requests

    def answer(self, replies: list[dict[str, Any]] | None) -> None:
        """The batch's replies to :meth:`requests`; ``None`` when its outcome is unknown."""
        self._sent, self._replies = True, replies

    def read_back(self, snapshot: Snapshot) -> None:
        """A read made after the batch, used instead of reading again."""
        self._after = snapshot

    def alone(self) -> None:
        """The claim batch these rode in was refused whole: send them in their own batch now (a
        claim refused at the metadata cap retries after it, in the room its deletions free). An
        outcome this batch leaves unknown, or a refusal, is settled by :meth:`outcome`'s read."""
        if self.settling is None or not self._requests:
            return
        self._after = None  # the claim's read-back is from before this batch
        try:
            self._send()
        except Exception as exc:  # a 400, a 429 past its retries: nothing applied
            log.warning("row writes refused alone too (%s); the read-back decides", exc)
            self._sent, self._replies = True, None

    def _send(self) -> None:
        try:
            self._replies = self.queue.backoff.call(lambda: self.queue.transport.batch_update(self._requests))
        except ServerError:  # maybe applied: the read-back decides
            self._replies = None
        self._sent = True

    # -- the outcome -------------------------------------------------------------------------------

    def outcome(self) -> dict[str, bool | None]:
        """Settle what is not settled yet (read, fields and the batch alone, when no claim carried
        them) and say, per token, whether its row now is in its status (see the class).

        :raises Exception: what stopped the plan or the batch (the rows stay pending).
        """
        if self.settling is None and self._error is None:
            self.read(None)
        if self._error is not None:
            raise self._error
        assert self.settling is not None
        if not self._sent and self._requests:
            self._send()
        done = self.settling.outcome(self._replies if self._requests else [], self._after)
        found: dict[str, bool | None] = {
            token: ok for (token, _, _, _), ok in zip(self.items, done, strict=True)
        }
        missed = [token for token, ok in found.items() if not ok]
        if missed:
            after = self.settling.after or self._after or self.queue.snapshot()
            for token in missed:
                asked = {status_value(Status(v), token) for v in self.latest[token]["old"]}
                rows = after.rows_with_token(token)
                if len(rows) == 1 and rows[0].status_cell.raw in asked and self.same(rows[0]):
                    found[token] = None
        return found
