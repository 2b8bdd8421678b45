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

:func:`relay_sheet_rows` settles every pending row of a sheet at once with
:func:`onceflow.sheets.settle.finish_many`: **1 read + 2 writes per sheet and pass, whatever the
number of rows** (header and rows by their anchors; the fields through the anchors; every fenced
status move, URL guard and anchor deletion in one ``spreadsheets.batchUpdate``), +1
``spreadsheets.get`` for a fresh queue's tab ids, +1 read when some move replied 0. A row is
finished only while its URL still names the article that was published (``row_key``): an editor's
new URL, typed before the read or between the read and the batch, is never left DONE with the old
link (``finish_many``'s guards put it back in flight, and ``sheet_reconcile`` runs the new URL).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.sheets import settle
from onceflow.sheets.model import Status, status_value
from onceflow.sheets.validation import judge_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import FollowUp
    from onceflow.ledger.outbox import OutboxRow
    from onceflow.sheets.model import Row
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
        queue: QueueTab | None = None
        try:
            queue = open_queue(spreadsheet_id, tab)
            outcome = settle_rows(queue, [row.data for row in rows])
        except Exception as exc:  # recorded on the rows; the next pass tries again
            error = f"{type(exc).__name__}: {exc}"
            log.warning("sheet %s: %d write-back(s) not relayed: %s", sheet, len(rows), error)
            outbox.mark_failed_delivery(ledger, [row.id for row in rows], error)
            report.errors.append(f"{sheet}: {error}")
            continue
        finally:
            if queue is not None:
                report.requests.update(queue.transport.calls)
        for token, ok in outcome.items():
            (report.written if ok else report.waiting if ok is None else report.left).append(token)
        done = [row.id for row in rows if outcome.get(str(row.data.get("token"))) is not None]
        report.relayed += outbox.mark_relayed(ledger, done)
        if report.waiting:
            error = f"not applied, the rows still wait for it: {sorted(report.waiting)}"
            outbox.mark_failed_delivery(ledger, [row.id for row in rows if row.id not in done], error)
            report.errors.append(f"{sheet}: {error}")
    return report


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
    """Each write's row moved to its status with its fields; per token, whether it now is, or
    ``None`` when its row still waits for the move in the state it was asked from (the batch was
    not applied: a 5xx, a quota refusal), so the write stays pending. Telling that apart from "not
    in a state to move" costs one read, only when some move did not happen.

    Writes of one token after the first are the same article's later commits, oldest first
    (NEEDS_REVIEW, then the reviewer's REJECTED or the approved DONE): the newest wins, and may
    also move the row from where the older ones started when none of them reached the sheet yet
    (PROCESSING -> REJECTED when the NEEDS_REVIEW before it is pending too). Writes that may come
    from the same statuses share one :func:`~onceflow.sheets.settle.finish_many` (in practice all
    of one kind: 1 read + 2 writes).
    """
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
    keys = {token: (w.get("row_key"), w.get("url")) for token, w in latest.items()}

    def same(row: Row) -> bool:
        key, url = keys.get(row.token or "", (None, None))
        if url is not None and row.url != url:
            return False
        return key is None or judge_url(row).key == key

    groups: dict[frozenset[Status], list[settle.Finish]] = {}
    for token, w in latest.items():
        froms = frozenset(Status(v) for v in w["old"])
        groups.setdefault(froms, []).append((token, Status(w["status"]), dict(w["fields"])))
    outcome: dict[str, bool | None] = {}
    for froms, finishes in groups.items():
        done = settle.finish_many(queue, finishes, froms, same=same)
        outcome.update({token: ok for (token, _, _), ok in zip(finishes, done, strict=True)})
    missed = [token for token, ok in outcome.items() if not ok]
    if missed:
        snapshot = queue.snapshot()
        for token in missed:
            asked = {status_value(Status(v), token) for v in latest[token]["old"]}
            rows = snapshot.rows_with_token(token)
            if len(rows) == 1 and rows[0].status_cell.raw in asked and same(rows[0]):
                outcome[token] = None
    return outcome
