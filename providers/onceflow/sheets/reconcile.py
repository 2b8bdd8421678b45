"""Reconcile the sheet with Airflow: find broken invariants and plan logged repairs.

Invariants, each checked from one read of the queue tab and the run states Airflow reports:

* a row PROCESSING (or NEEDS_REVIEW: its run waits for a reviewer) past its lease has a queued
  or running run; if the run is missing (the claimer died between claim and run creation) it is
  created, if it failed it is cleared, both under the same deterministic run id, so repair never
  duplicates work; a REJECTED row is final, like DONE;
* a URL is owned by one live row; a second PROCESSING row for it becomes DUPLICATE. The owner
  is a DONE/FAILED row if there is one, else the row whose claim token is in the article's run
  conf (the run Airflow kept), else the earliest claim;
* a claimed row whose URL is not valid (its claimer stopped between the claim and marking it) is
  marked INVALID with the reason, once past the lease;
* every run id is built from the version the row was *claimed under* (carried in its claim
  token), never from the reconciler's own parameter, so repair cannot start a second run of an
  article under another version;
* a DONE row has a published link, and a published link belongs to a DONE row (flagged);
* with the work ledger: a claimed row has an ``article`` item (registered when missing); an item
  the ledger gave up on (``failed``) or sent back for correction (``needs_correction``) turns its
  PROCESSING row FAILED or INVALID with the ledger's reason once no run is active; a row FAILED
  in the sheet abandons its pending item; a DONE row with a link records the result the ledger
  missed; a successful run whose item has no result is flagged. Ledger repairs are ledger
  transitions with the reconciler as actor; sheet repairs go to the audit tab.

Planning is pure (this module); :func:`apply` executes a plan through the queue and callbacks, and
every action done is appended to the audit tab with its reason and time (also when a later action
fails: the entries of the earlier ones are appended before the error propagates).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onceflow.ledger import states
from onceflow.sheets.keys import article_run_conf, parse_run_id, pipeline_run_id
from onceflow.sheets.model import (
    IN_FLIGHT_STATUSES,
    LIVE_STATUSES,
    Row,
    Snapshot,
    Status,
    token_time,
    token_version,
)
from onceflow.sheets.validation import duplicate_reason, judge_url

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime, timedelta

    from onceflow.ledger.models import FollowUp
    from onceflow.sheets.ledger_link import LedgerView
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.relay import SheetRelayReport

log = logging.getLogger(__name__)

REDRIVE_MISSING = "claimed row had no run (claimer stopped between claim and run creation)"
REDRIVE_FAILED = "run failed; cleared and re-run under the same run id"
GIVE_UP = "run failed after {n} re-drives; row marked FAILED"
SUCCESS_NOT_DONE = "run succeeded but the row is still PROCESSING (nothing wrote the result back)"
SUCCESS_IN_REVIEW = "run succeeded but the row is still NEEDS_REVIEW (nothing wrote the decision back)"
REDRIVE_BATCH = "batch run {run} {state} before the row's outcome; re-driven alone under the article's run id"
BATCH_NOT_WRITTEN = (
    "batch run {run} committed the row's outcome but the row does not show it yet (the outbox holds it)"
)
DONE_NO_LINK = "row is DONE but has no published_url"
LINK_NOT_DONE = "row has a published_url but its status is not DONE"
CLAIMED_TWICE = "same URL claimed by two rows; this claim is a duplicate of {first}"
CLAIMED_INVALID = "claimed row has no valid URL (its claimer stopped before marking it): {why}"
REASON_MISSING = "INVALID/DUPLICATE row had no reason; reason written"
ROW_GONE = "row carrying the claim was deleted before the repair; nothing written"
RUN_ID_WRONG_ROW = "run_id cell named another article's run (a write that landed on a moved row); corrected"
LEDGER_MISSING = "claimed in the sheet but not in the ledger (claimer stopped between the two); registered"
LEDGER_GAVE_UP = "ledger gave the article up: {why}"
LEDGER_INVALID = "ledger sent the article back for correction: {why}"
SHEET_GAVE_UP = "row is FAILED in the sheet; nothing will run its ledger item"
SHEET_REJECTED = "row is REJECTED in the sheet (a reviewer's decision); nothing will run its ledger item"
SHEET_DONE = "row is DONE with a published link but the ledger has no result; recorded from the sheet"
RUN_OK_LEDGER_NOT = "run succeeded but the ledger item is {state}, without a committed result"

#: the ledger step reconcile's final transitions are filed under in the outbox
RECONCILE_STEP = "sheet_reconcile"

#: Action kinds carried out in the ledger (the rest act on the sheet or on Airflow).
LEDGER_ACTIONS = frozenset({"ledger_register", "ledger_abandon", "ledger_record_done"})

#: Run states that mean "something is already driving this row".
ACTIVE_RUN_STATES = frozenset({"queued", "running"})


@dataclass(frozen=True)
class Action:
    """One repair or flag.

    :param kind: ``create_run``, ``reset_run``, ``transition``, ``rewrite`` (derived cells of
        the row, recomputed from the row itself), ``flag``, or ``skipped`` (audit only: a repair
        whose row the editor deleted before it could be written).
    """

    kind: str
    reason: str
    row: Row
    run_id: str = ""
    new_status: Status | None = None
    fields: tuple[tuple[str, str], ...] = ()

    def audit_entry(self, now: datetime) -> dict[str, str]:
        """The action as a row of the sheet's ``audit`` tab."""
        return {
            "time": now.isoformat(timespec="seconds"),
            "action": self.kind,
            "reason": self.reason,
            "row_key": judge_url(self.row).key or "",
            "url": self.row.url,
            "claim_token": self.row.token or "",
            "run_id": self.run_id,
        }


@dataclass
class Plan:
    """The actions one reconcile pass decided on, and the anchors it may release."""

    actions: list[Action] = field(default_factory=list)
    #: claim tokens of PROCESSING rows whose run succeeded: nothing writes through their row
    #: anchors any more, so the sweep may remove them. Listed on every pass, unlike their flag
    #: (written once): a later write adopts a fresh anchor, and a pass can stop before its sweep.
    released: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[Action]:
        """The planned actions of one kind."""
        return [a for a in self.actions if a.kind == kind]


def _already_logged(audit: list[dict[str, str]], action: Action) -> int:
    """How many passes audited ``action`` (its row, kind and reason).

    Counted by distinct audit times: httplib2 resends a ``values.append`` whose connection closed
    before the reply, so one pass's entry can be in the tab twice, and a re-drive counted twice
    would give its row up early. One pass audits an action once, and passes are seconds apart.
    An entry without a time (typed by hand) counts on its own.
    """
    times = [
        e.get("time", "")
        for e in audit
        if e.get("action") == action.kind
        and e.get("reason") == action.reason
        and e.get("claim_token", "") == (action.row.token or "")
        and e.get("url", "") == action.row.url
    ]
    return len({t for t in times if t}) + times.count("")


def plan(
    snapshot: Snapshot,
    *,
    now: datetime,
    lease: timedelta,
    version: str,
    run_state: Callable[[str], str | None],
    audit: list[dict[str, str]],
    max_redrives: int = 3,
    ledger: Callable[[str], LedgerView | None] | None = None,
    run_claim: Callable[[str], str | None] | None = None,
    batch_state: Callable[[str], str | None] | None = None,
) -> Plan:
    """Decide what to repair.

    :param snapshot: one read of the queue tab.
    :param now: current time (aware).
    :param lease: how long a claim may stay PROCESSING before its run is checked.
    :param version: processing version of claims whose token carries none (claims made before
        tokens carried their version, hand-typed tokens); every other row's run id uses the
        version in its own claim token.
    :param run_state: run id -> Airflow run state (``queued``, ``running``, ``success``,
        ``failed``), or None when no such run exists.
    :param audit: the audit tab so far; flags are not repeated, re-drives are counted.
    :param max_redrives: failed runs re-driven at most this often per claim, then FAILED.
    :param ledger: row key -> the article's ledger item (``None`` when it has none); leave the
        parameter out to reconcile the sheet with Airflow only.
    :param run_claim: run id -> the claim token in that run's conf (``None`` when there is no such
        run or its conf has none); decides which of two live rows of one URL owns the article.
        Asked only for URLs held by more than one live row.
    :param batch_state: ``article_batch`` run id -> its state (``None``: no such run). A row whose
        ledger item was registered for a batch run (the batch lane) and has no ``article_pipeline``
        run is driven by that batch run: left alone while it is queued or running (a review can
        keep it running for days); once it has ended without committing the row's outcome, the
        row is re-driven alone in ``article_pipeline`` under the article's run id (then repaired
        like any per-article row). Leave it out and such rows are treated as per-article rows.
    """
    result = Plan()

    def add(action: Action, once: bool = False) -> None:
        if once and _already_logged(audit, action):
            return
        result.actions.append(action)

    owner = _owners(snapshot, version, run_claim)
    for row in snapshot.rows:
        key = judge_url(row).key
        first = owner.get(key or "")
        if first is not None and first is not row and row.status is Status.PROCESSING and row.token:
            add(
                Action(
                    "transition",
                    CLAIMED_TWICE.format(first=first.token or first.url),
                    row,
                    new_status=Status.DUPLICATE,
                    fields=(("reason", duplicate_reason(first)),),
                )
            )

    duplicates = {a.row.token for a in result.actions}
    for row in snapshot.rows:
        for action in _derived_cells(row, owner):
            add(action)
        link = row.get("published_url").strip()
        if row.status is Status.DONE and not link:
            add(Action("flag", DONE_NO_LINK, row), once=True)
        if link and row.status is not Status.DONE:
            add(Action("flag", LINK_NOT_DONE, row), once=True)
        view: LedgerView | None = None
        if ledger is not None:
            view, settled = _against_ledger(row, ledger, run_state, version, duplicates, add, batch_state)
            if settled:
                continue  # the ledger settled this row
        # NEEDS_REVIEW is in flight too: its run waits (deferred, so "running") for a reviewer,
        # and is left alone while it does; only a missing or failed run is repaired
        if row.status not in IN_FLIGHT_STATUSES or not row.token or row.token in duplicates:
            continue
        claimed_at = token_time(row.token)
        if claimed_at is not None and now - claimed_at < lease:
            continue
        verdict = judge_url(row)
        if verdict.key is None:
            # no article, so no run or ledger item can exist for it: finish what its claimer began
            add(
                Action(
                    "transition",
                    CLAIMED_INVALID.format(why=verdict.reason),
                    row,
                    new_status=Status.INVALID,
                    fields=(("reason", verdict.reason),),
                )
            )
            continue
        run_id = pipeline_run_id(verdict.key, claim_version(row, version))
        state = run_state(run_id)
        batch = view.batch_of(row.token) if view is not None and batch_state is not None else None
        if state is None and batch is not None and batch_state is not None:
            # the batch lane: the batch run drives the row until it ends
            ended = batch_state(batch)
            if ended in ACTIVE_RUN_STATES:
                continue
            if view is not None and view.has_outcome():
                result.released.append(row.token)
                add(Action("flag", BATCH_NOT_WRITTEN.format(run=batch), row, batch), once=True)
                continue
            why = REDRIVE_BATCH.format(run=batch, state=f"ended {ended}" if ended else "is gone")
            add(Action("create_run", why, row, run_id))
        elif state is None:
            add(Action("create_run", REDRIVE_MISSING, row, run_id))
        elif state in ACTIVE_RUN_STATES:
            continue
        elif state == "failed":
            redrives = _already_logged(audit, Action("reset_run", REDRIVE_FAILED, row))
            if redrives >= max_redrives:
                # the row's reason says why: the give-up and what the ledger last recorded (the
                # error that outlived every retry: a 503 that never ends, a bad connection...)
                why = GIVE_UP.format(n=redrives)
                if view is not None and view.reason.strip():
                    why = f"{why}; ledger: {view.reason.strip().splitlines()[0][:300]}"
                add(
                    Action(
                        "transition",
                        GIVE_UP.format(n=redrives),
                        row,
                        run_id,
                        Status.FAILED,
                        fields=(("reason", why),),
                    )
                )
                if view is not None and view.state in (states.PENDING, states.LEASED):
                    add(Action("ledger_abandon", SHEET_GAVE_UP, row, run_id))
            else:
                add(Action("reset_run", REDRIVE_FAILED, row, run_id))
        elif state == "success":
            result.released.append(row.token)
            flag = SUCCESS_NOT_DONE if row.status is Status.PROCESSING else SUCCESS_IN_REVIEW
            add(Action("flag", flag, row, run_id), once=True)
    return result


def _against_ledger(
    row: Row,
    ledger: Callable[[str], LedgerView | None],
    run_state: Callable[[str], str | None],
    version: str,
    duplicates: set[str | None],
    add: Callable[..., None],
    batch_state: Callable[[str], str | None] | None = None,
) -> tuple[LedgerView | None, bool]:
    """Compare one claimed row with its ledger item (and its run, where that decides).

    :return: the item (looked up once per row; the re-drive logic reuses it) and whether a
        transition of the row was planned, which settles it.
    """
    key = judge_url(row).key
    if row.status not in LIVE_STATUSES or not row.token or key is None or row.token in duplicates:
        return None, False
    view = ledger(key)
    run_id = pipeline_run_id(key, claim_version(row, version))
    batch = view.batch_of(row.token) if view is not None and batch_state is not None else None

    def driver_state() -> str | None:
        """The state of the run driving the row: its own, else (batch lane) its batch run's."""
        state = run_state(run_id)
        if state is None and batch is not None and batch_state is not None:
            return batch_state(batch)
        return state

    if row.status in IN_FLIGHT_STATUSES:
        if view is None:
            add(Action("ledger_register", LEDGER_MISSING, row, run_id))
            return view, False
        if view.state in (states.FAILED, states.NEEDS_CORRECTION):
            if driver_state() in ACTIVE_RUN_STATES:
                return view, False  # a run (a recheck, a re-drive, its batch) may still settle it
            failed = view.state == states.FAILED
            why = (view.reason or "no reason recorded").splitlines()[0][:300]
            add(
                Action(
                    "transition",
                    (LEDGER_GAVE_UP if failed else LEDGER_INVALID).format(why=why),
                    row,
                    run_id,
                    Status.FAILED if failed else Status.INVALID,
                    fields=(("reason", why),),
                )
            )
            return view, True
        if view.state in (states.PENDING, states.LEASED) and run_state(run_id) == "success":
            add(Action("flag", RUN_OK_LEDGER_NOT.format(state=view.state), row, run_id), once=True)
    elif view is None or not (view.state == states.PENDING or view.lease_expired):
        pass  # only an item nobody is working on is repaired from the sheet
    elif row.status is Status.FAILED:
        add(Action("ledger_abandon", SHEET_GAVE_UP, row, run_id))
    elif row.status is Status.REJECTED:
        add(Action("ledger_abandon", SHEET_REJECTED, row, run_id))
    elif row.status is Status.DONE and row.get("published_url").strip():
        add(Action("ledger_record_done", SHEET_DONE, row, run_id))
    return view, False


def claim_version(row: Row, default: str) -> str:
    """The processing version ``row`` was claimed under.

    From its claim token (every claim since tokens carry it); for an older token, from its
    ``run_id`` cell when that names this row's article; else ``default``.
    """
    version = token_version(row.token or "")
    if version is not None:
        return version
    named = parse_run_id(row.get("run_id"))
    if named is not None and named[0] == judge_url(row).key:
        return named[1]
    return default


def _owners(
    snapshot: Snapshot, version: str, run_claim: Callable[[str], str | None] | None
) -> dict[str, Row]:
    """Row key -> the live row that owns the article.

    A DONE or FAILED row first (its work is done or given up); then the PROCESSING row whose
    claim token is in the article's run conf: two claimers can both keep one URL (rows moved
    under one of them), both create the same run id, and Airflow keeps the first conf; that row
    is the one the run works on, whatever the tokens' order. Without such a run, the earliest
    claim (tokens start with the claim time).
    """
    live: dict[str, list[Row]] = {}
    for row in snapshot.rows:
        key = judge_url(row).key if row.status in LIVE_STATUSES else None
        if key is not None:
            live.setdefault(key, []).append(row)
    asked: dict[str, str | None] = {}

    def in_run(key: str, row: Row) -> bool:
        if run_claim is None or row.status is not Status.PROCESSING or not row.token:
            return False
        run_id = pipeline_run_id(key, claim_version(row, version))
        if run_id not in asked:
            asked[run_id] = run_claim(run_id)
        return asked[run_id] == row.token

    owners: dict[str, Row] = {}
    for key, rows in live.items():
        if len(rows) == 1:
            owners[key] = rows[0]
            continue
        owners[key] = min(
            rows,
            key=lambda r: (r.status is Status.PROCESSING, not in_run(key, r), r.token or ""),
        )
    return owners


def _derived_cells(row: Row, owner: dict[str, Row]) -> list[Action]:
    """Cells that are pure functions of the row (``reason``, ``run_id``) and disagree with it.

    Writes go through the claim's row anchor, so they cannot land on a moved row; these checks
    stay for sheets written before row anchors, and for cells an editor copied between rows.
    """
    if not row.token:
        return []
    verdict = judge_url(row)
    actions = []
    if row.status in (Status.INVALID, Status.DUPLICATE) and not row.get("reason").strip():
        if row.status is Status.INVALID and not verdict.ok:
            reason = verdict.reason
        else:
            first = owner.get(verdict.key or "")
            reason = duplicate_reason(first) if first is not None and first is not row else ""
        if reason:
            actions.append(Action("rewrite", REASON_MISSING, row, fields=(("reason", reason),)))
    named = parse_run_id(row.get("run_id"))
    if verdict.key and named is not None and named[0] != verdict.key:
        right = pipeline_run_id(verdict.key, named[1])
        actions.append(Action("rewrite", RUN_ID_WRONG_ROW, row, right, fields=(("run_id", right),)))
    return actions


def apply(
    actions: list[Action],
    queue: SheetQueue,
    *,
    now: datetime,
    create_run: Callable[[str, dict[str, str], bool], str],
    ledger_repair: Callable[[Action, dict[str, str]], bool] | None = None,
    send_rows: Callable[[list[FollowUp]], SheetRelayReport] | None = None,
) -> list[dict[str, str]]:
    """Carry out a plan; append every action to the audit tab; return the audit entries.

    The entries are appended in one request at the end, and also when an action raises (a 5xx
    after retries, the task being terminated): the actions done before it are audited, then the
    error propagates. Re-drives are counted from the audit tab, so an unaudited ``reset_run``
    would let a failing run be re-driven past ``max_redrives``.

    The pass's final transitions (INVALID, DUPLICATE, FAILED) leave as every final status does:
    each a write from the status the plan read, only while the row still holds the URL judged,
    all sent together after the other actions (one relay pass for all of them). A transition is
    audited when it was written or committed to the outbox (the next relay pass writes it), not
    when the row had already moved on.

    :param create_run: ``(run_id, conf, reset) -> "created" | "exists"``.
    :param ledger_repair: ``(action, run conf) -> changed``, carries out the ``ledger_*`` actions
        (an unchanged ledger, e.g. a repair another pass already made, writes no audit entry).
    :param send_rows: ``(writes) -> report``: commits the transitions to the ledger's outbox and
        relays them (``sheet_reconcile`` passes :func:`onceflow.sheets.relay.send_rows` with its
        ledger); default: settled at once, without the outbox.
    """
    from onceflow.sheets import relay

    entries: list[dict[str, str] | None] = []
    moves: dict[str, tuple[int, Action]] = {}  # token -> (its entry's place, the transition)
    writes: list[FollowUp] = []
    try:
        for action in actions:
            if action.kind == "transition" and action.new_status is not None:
                token = action.row.token or ""
                if token and token not in moves:
                    moves[token] = (len(entries), action)
                    writes.append(_final_write(action, queue, now))
                    entries.append(None)
                continue
            entries.append(
                _carry_out(action, queue, now=now, create_run=create_run, ledger_repair=ledger_repair)
            )
    except BaseException:
        done = [e for e in entries if e is not None]
        if done:
            try:
                queue.audit(done)
            except Exception as err:  # the action's own error is the one to raise
                log.error("could not audit %d completed repairs (%s): %s", len(done), err, done)
        raise
    if writes:
        send = send_rows or (lambda ws: relay.send_rows(queue, None, RECONCILE_STEP, ws))
        report = send(writes)
        for token, (at, action) in moves.items():
            if token in report.written or (token in report.committed and token not in report.left):
                entries[at] = action.audit_entry(now)
            else:
                log.info("row %s: %s not written (%s)", token, action.new_status, report.errors or "moved on")
    done = [e for e in entries if e is not None]
    queue.audit(done)
    return done


def _final_write(action: Action, queue: SheetQueue, now: datetime) -> FollowUp:
    """A transition of the plan as a write for the outbox: from the status the plan read
    (PROCESSING, or NEEDS_REVIEW for a row whose run failed or that the ledger gave up while it
    waited for a reviewer), only while the row holds the URL the plan judged."""
    from onceflow.sheets.relay import decided_write, queue_target

    row = action.row
    assert action.new_status is not None
    old = row.status if row.status in IN_FLIGHT_STATUSES else Status.PROCESSING
    return decided_write(
        queue_target(queue),
        row.token or "",
        action.new_status,
        dict(action.fields).get("reason", action.reason),
        url=row.url,
        row_key=None,
        old=(old,),
        key=now.isoformat(timespec="seconds"),
    )


def _carry_out(
    action: Action,
    queue: SheetQueue,
    *,
    now: datetime,
    create_run: Callable[[str, dict[str, str], bool], str],
    ledger_repair: Callable[[Action, dict[str, str]], bool] | None,
) -> dict[str, str] | None:
    """Carry out one action other than a transition; its audit entry, or ``None`` when nothing was done."""
    row = action.row
    token = row.token or ""
    if action.kind in ("create_run", "reset_run"):
        outcome = create_run(action.run_id, run_conf(row, queue), action.kind == "reset_run")
        log.info("%s %s: %s", action.kind, action.run_id, outcome)
    elif action.kind in LEDGER_ACTIONS:
        if ledger_repair is None or not ledger_repair(action, run_conf(row, queue)):
            return None
    elif action.kind == "rewrite":
        try:
            queue.write_fields(token, dict(action.fields))
        except LookupError:
            # the anchor went with the deleted row: the write had nowhere to land, and says so
            log.info("row of %s is gone; %s not written", token, action.fields)
            return Action("skipped", ROW_GONE, row, action.run_id).audit_entry(now)
        except RuntimeError as err:
            log.info("could not rewrite %s for %s (%s); next pass will retry", action.fields, token, err)
            return None
    return action.audit_entry(now)


def run_conf(row: Row, queue: SheetQueue) -> dict[str, str]:
    """The ``article_pipeline`` run conf of a claimed row (what ``sheet_claim`` would have sent,
    under the version the row was claimed under)."""
    verdict = judge_url(row)
    return article_run_conf(
        token=row.token or "",
        key=verdict.key or "",
        url=verdict.normalised_url or row.url,
        spreadsheet_id=getattr(queue.transport, "spreadsheet_id", ""),
        sheet=queue.sheet,
        version=claim_version(row, queue.version),
    )
