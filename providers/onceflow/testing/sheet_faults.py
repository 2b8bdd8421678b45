"""Seeded fault schedules for a sheet-driven queue, and a checker of its promises (issue 22).

In the spirit of Jepsen: :func:`generate` turns a seed into a schedule of claimers, an editor
(insert, delete, sort, a new URL typed into a row, a status typed over), faults of the Sheets
emulator (a reply lost after the write was applied, which httplib2 answers by sending the request
again; a 500 after apply; 429; 500; slow replies), the developer-metadata cap closing in, an edit
that lands between a write-back's read and its write, and workers that commit every row status
(DONE, FAILED, NEEDS_REVIEW, REJECTED) to the ledger's outbox with their step and relay it, send
articles to review (approved or rejected), crash at named points (between a commit and its relay,
inside a relay after its sheet batch) or are paused past their lease; :func:`run_schedule` plays it against a running Sheets emulator
(real google-api-python-client over HTTP) and a real ledger, then drives every row to rest as
``sheet_reconcile`` and the article chain would, and :func:`check` states what must hold:

* no article published twice, and every DONE row beside the URL whose article was published for
  it (its link is that article's), agreeing with the ledger (a FAILED row's item is not done; a
  REJECTED row's article was rejected in the ledger and not published by that claim's work),
  and no write-back left
  waiting in the outbox;
* every row at rest is final (or a status onceflow never touches), every PROCESSING row in the
  sheet during the run carries a token some claim handed out, and none is left in flight;
* at every step, at most one row anchor per token (resends must not eat the metadata room) and
  the metadata under the cap; at rest, no anchor left;
* a claim refused at the metadata cap only when not one more row fitted (counting the room the
  anchors of the write-backs waiting in the outbox free: they ride in the wake-up's batch);
* when a claim returns, each token it handed out is on one row, beside the URL it was handed out
  for (the work created is for the URL beside the token, never for another row's).

With ``moved=`` (a probability per seed), a schedule also gets a **resent claim with rows moving
twice** (``resend_moved``): the claim's reply is lost after it applied, a NEW row lands at one
claimed row's position before the resend (the emulator's ``after_apply`` hook, between the two
copies), so the resend claims it too and a token sits on two rows; then the editor inserts or
deletes a row before the claim's re-token write, which is aimed at a row position (issue 22,
defect 2). Its draws come from their own generator, so the other steps of a seed stay as they
were. Off by default: with it, the current code also leaves a second anchor of the token on the
re-tokened row, and a token still on two rows after the re-token PROCESSING for
``sheet_reconcile``, which the rest phase does not model (``docs/sheet-queue.md``).

A failing schedule raises :class:`ScheduleFailed`, whose message names the seed and how to replay
it: ``python -m onceflow.testing.sheet_faults --seed N`` (its own emulator and SQLite ledger), or
``run_schedule(emulator, ledger, N)`` in a test. Users can run their own sheet-driven work
through the same faults by passing ``work=`` (what a claimed row's processing does).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.sheets.transport import GoogleSheetsTransport
from onceflow.testing.sheets_emulator.limits import METADATA_LIMIT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from onceflow.ledger import Ledger
    from onceflow.sheets.protocol import Claim, SheetQueue

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
#: the kinds of step a schedule is made of
STEPS = (
    "claim",
    "fault",
    "cap",
    "uncap",
    "edit",
    "edit_in_flight",
    "work",
    "crash",
    "stale",
    "resend_at_cap",
)
EDITS = ("insert", "delete", "sort", "new_url", "status")
FAULTS = ("apply_then_drop", "apply_then_fail", "429", "500", "latency")
CRASH_POINTS = ("after_lease", "after_publish", "after_commit")
#: a reviewer's decisions, and where a ``review`` step's worker may die (None: it does not)
REVIEWS = ("approve", "reject")
REVIEW_CRASHES = (None, "after_commit", "after_relay_batch")
#: the default probability of ``review`` steps in a schedule
REVIEW = 0.5
#: rows the claim (or ``sheet_reconcile``) must turn INVALID or DUPLICATE: a URL that is not one,
#: an empty URL, a second row of a URL in the sheet, an invalid URL typed into a row in flight
BAD_ROWS = ("invalid", "empty", "duplicate", "retyped")
#: the default probability of ``bad_row`` steps in a schedule
BAD = 0.5


class ScheduleFailed(AssertionError):
    """A promise broke under a generated schedule; the message says which, and how to replay."""


@dataclass
class Step:
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


def generate(
    seed: int,
    *,
    rows: int = 6,
    steps: int = 12,
    moved: float = 0.0,
    review: float = REVIEW,
    bad: float = BAD,
) -> list[Step]:
    """The schedule of ``seed``: a pure function of it, so a failing seed replays exactly.

    :param moved: the probability that the schedule also has a ``resend_moved`` step.
    :param review: the probability that it has one or two ``review`` steps (an article sent to
        review, then approved or rejected; a crash between a commit and its relay, or inside the
        relay after its sheet batch).
    :param bad: the probability that it has one or two ``bad_row`` steps (a row the claim finds
        INVALID or DUPLICATE, then a wake-up that may die between the verdicts' commit and their
        relay, or inside the relay after its sheet batch; or an invalid URL typed into a row in
        flight, for ``sheet_reconcile``).
    """
    rng = random.Random(seed)
    out: list[Step] = []
    for _ in range(steps):
        kind = rng.choices(STEPS, weights=(5, 3, 1, 1, 3, 2, 4, 1, 1, 1))[0]
        if kind == "claim":
            out.append(Step(kind, {"limit": rng.randint(1, rows)}))
        elif kind == "fault":
            method = rng.choice(
                # spreadsheets.get: the claim's read (tab id and values); values.batchGet: read-backs
                [
                    "spreadsheets.batchUpdate",
                    "spreadsheets.get",
                    "values.batchGet",
                    "values.batchUpdateByDataFilter",
                ]
            )
            out.append(Step(kind, {"fault": rng.choice(FAULTS), "method": method}))
        elif kind == "cap":
            out.append(Step(kind, {"room": rng.randint(1, rows)}))
        elif kind == "resend_at_cap":  # a claim's reply lost, its resend meeting the cap
            limit = rng.randint(1, rows)
            out.append(Step(kind, {"limit": limit, "room": rng.randint(limit, 2 * limit)}))
        elif kind in ("edit", "edit_in_flight"):
            out.append(
                Step(kind, {"edit": rng.choice(EDITS), "pick": rng.random(), "n": rng.randint(0, 10**6)})
            )
        elif kind == "crash":
            out.append(Step(kind, {"point": rng.choice(CRASH_POINTS)}))
        else:
            out.append(Step(kind))
    draw = random.Random(f"resend_moved-{seed}")  # its own stream: the steps above are unchanged
    if draw.random() < moved:
        args = {"limit": draw.randint(1, rows), "again": draw.choice(("insert", "delete", "none"))}
        out.insert(draw.randint(0, len(out)), Step("resend_moved", {**args, "n": draw.randint(0, 10**6)}))
    draw = random.Random(f"review-{seed}")
    if draw.random() < review:
        for _ in range(draw.randint(1, 2)):
            decided = {"decision": draw.choice(REVIEWS), "crash": draw.choice(REVIEW_CRASHES)}
            out.insert(draw.randint(0, len(out)), Step("review", decided))
    draw = random.Random(f"bad-{seed}")
    if draw.random() < bad:
        for _ in range(draw.randint(1, 2)):
            drawn: dict[str, Any] = {
                "bad": draw.choice(BAD_ROWS),
                "crash": draw.choice(REVIEW_CRASHES),
                "pick": draw.random(),
            }
            out.insert(draw.randint(0, len(out)), Step("bad_row", drawn))
    return out


class CachedResources:
    """A ``sheets`` service whose resource objects (``spreadsheets()``, ``.values()``...) are made
    once: google-api-python-client builds every method's docstring each time a resource is made,
    which costs more than the request itself against a local emulator. Requests are unchanged."""

    def __init__(self, resource: Any) -> None:
        self._resource = resource
        self._children: dict[str, CachedResources] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._resource, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if args or kwargs:  # an API method: a request
                return attr(*args, **kwargs)
            if name not in self._children:  # a child resource
                self._children[name] = CachedResources(attr())
            return self._children[name]

        return call


class _Interposed(GoogleSheetsTransport):
    """The workers' transport: runs an armed editor action just before the next write."""

    def __init__(self, service: Any, spreadsheet_id: str) -> None:
        super().__init__(service, spreadsheet_id)
        self.armed: list[Callable[[], None]] = []
        #: an action fired before the second conditional write from now (a claim's re-token)
        self.second: Callable[[], None] | None = None
        self._seen = 0
        #: tokens a claim's re-token minted (no claim hands them out; sheet_reconcile runs them)
        self.minted: set[str] = set()

    def _fire(self) -> None:
        while self.armed:
            self.armed.pop(0)()
        if self.second is not None:
            self._seen += 1
            if self._seen == 2:
                action, self.second, self._seen = self.second, None, 0
                action()

    def arm_second(self, action: Callable[[], None] | None) -> None:
        self.second, self._seen = action, 0

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any("findReplace" in r for r in requests):
            self._fire()
        for r in requests:
            find = str(r.get("findReplace", {}).get("find", ""))
            replacement = str(r.get("findReplace", {}).get("replacement", ""))
            if (
                find.startswith("PROCESSING #")
                and replacement.startswith("PROCESSING #")
                and find != replacement
            ):
                self.minted.add(replacement.split("#", 1)[1])
        return super().batch_update(requests)


@dataclass
class Run:
    """What one schedule did: its seed, the claims handed out, publications, violations."""

    seed: int
    handed: dict[str, Claim] = field(default_factory=dict)
    published: Counter[str] = field(default_factory=Counter)
    #: the claim token whose work published each article (the first: publishing is create-only)
    published_by: dict[str, str] = field(default_factory=dict)
    tokens_seen: set[str] = field(default_factory=set)
    #: the reviewer's decision per claim token sent to review
    reviews: dict[str, str] = field(default_factory=dict)
    #: tokens a claim took to be INVALID or DUPLICATE (their status leaves through the outbox)
    rejected: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


def link(row_key: str) -> str:
    """The published link of an article (one per row key, as ``publish_path`` makes it)."""
    return f"https://published.example.org/{row_key}"


class _Crash(Exception):
    """A worker dies at a named point."""


def services(emulator: Any) -> tuple[Any, Any]:
    """The workers' and the editor's ``sheets`` services on ``emulator`` (make them once, reuse)."""
    from onceflow.sheets.transport import anonymous_service

    return CachedResources(anonymous_service(emulator.endpoint)), CachedResources(
        anonymous_service(emulator.endpoint)
    )


def run_schedule(
    emulator: Any,
    ledger: Ledger,
    seed: int,
    *,
    rows: int = 6,
    steps: int = 12,
    clients: tuple[Any, Any] | None = None,
    moved: float = 0.0,
    review: float = REVIEW,
    bad: float = BAD,
) -> Run:
    """Play schedule ``seed`` against ``emulator`` (a running
    :class:`~onceflow.testing.sheets_fixtures.SheetsEmulator`) and ``ledger``; bring every row to
    rest; check the promises. :raises ScheduleFailed: naming the seed and the replay command.

    :param clients: the workers' and the editor's services (:func:`services`), reused across
        schedules; made afresh when not given.
    :param moved: the probability of a ``resend_moved`` step (see the module docstring).
    :param review: the probability of ``review`` steps (:func:`generate`).
    :param bad: the probability of ``bad_row`` steps (:func:`generate`).
    """
    from onceflow.sheets.model import Snapshot, Status
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.retry import Backoff
    from onceflow.testing.sheet_edits import batch_update, delete_rows, insert_rows, set_row, sort_rows

    FINAL = {Status.DONE, Status.FAILED, Status.INVALID, Status.DUPLICATE, Status.REJECTED}
    rng = random.Random(seed)
    urls = [f"https://news.example.com/s{seed}-{i}" for i in range(rows)]
    sid = emulator.create_spreadsheet(
        f"faults-{seed}", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]}
    )
    book = emulator.server.store.spreadsheets[sid]
    # the cap is the store's (it is put on each spreadsheet as a request reads it); schedules run
    # one at a time, and each ends with Google's figure back in place
    store = emulator.server.store
    store.metadata_limit = METADATA_LIMIT
    worker_service, editor = clients or services(emulator)
    transport = _Interposed(worker_service, sid)
    queue = SheetQueue(transport, backoff=Backoff(base=0.001, cap=0.01), rng=random.Random(seed), spread=2)
    run = Run(seed)
    pending: list[str] = []  # tokens handed out and not yet worked on

    def values() -> list[list[Any]]:
        return emulator.values(sid, "queue")

    def edit(kind: str, pick: float, n: int) -> None:
        return by_hand(functools.partial(_edit, kind, pick, n))

    def by_hand(action: Callable[[], Any]) -> None:
        from http.client import HTTPException

        from googleapiclient.errors import HttpError

        for _ in range(3):  # a fault armed for the workers may hit the editor's request: it tries again
            try:
                action()
                return
            except (HttpError, HTTPException, OSError):
                continue

    def _edit(kind: str, pick: float, n: int) -> None:
        height = len(values())
        row = 1 + int(pick * max(height - 1, 1))  # a data row's 0-based index
        if kind == "insert":
            batch_update(
                editor,
                sid,
                insert_rows(0, row),
                set_row(0, row, [f"https://news.example.com/s{seed}-e{n}", "NEW"]),
            )
        elif kind == "delete" and height > 2:
            batch_update(editor, sid, delete_rows(0, row, row + 1))
        elif kind == "sort":
            batch_update(editor, sid, sort_rows(0, 0, descending=bool(n % 2)))
        elif kind == "new_url":
            # into a row not yet final: retyping a finished row's URL is the editor's own business
            open_rows = [r.number - 1 for r in Snapshot.from_values(values()).rows if r.status not in FINAL]
            if open_rows:
                at = open_rows[int(pick * len(open_rows))]
                batch_update(editor, sid, set_row(0, at, [f"https://news.example.com/s{seed}-u{n}"]))
        elif kind == "status" and height > 1:
            cell = ("NEW", "HOLD", "")[n % 3]
            cells = {"updateCells": {"start": {"sheetId": 0, "rowIndex": min(row, height - 1), "columnIndex": 1},
                                     "rows": [{"values": [{"userEnteredValue": {"stringValue": cell}}]}],
                                     "fields": "userEnteredValue"}}  # fmt: skip
            batch_update(editor, sid, cells)

    def observe(where: str) -> None:
        anchors = Counter(m.value for m in book.all_metadata() if m.key == "onceflow.claim")
        doubled = [t for t, k in anchors.items() if k > 1]
        if doubled:
            run.violations.append(f"{where}: tokens anchored more than once: {doubled}")
        from onceflow.testing.sheets_emulator.limits import usage

        if book.metadata_limit is not None and max(usage(book).values()) > book.metadata_limit:
            run.violations.append(f"{where}: developer metadata over the cap")
        for r in Snapshot.from_values(values()).rows:
            if r.status is Status.PROCESSING and r.token:
                run.tokens_seen.add(r.token)

    def claim(limit: int, crash: str | None = None) -> None:
        from onceflow.sheets.retry import Refused, RetriesExhausted
        from onceflow.sheets.wakeup import claim_and_relay

        try:
            # a sheet_claim wake-up: what waits in the outbox rides in the claim's read and batch
            result, relayed = claim_and_relay(queue, ledger, limit)
            if relayed.errors:
                run.log.append(f"relay left rows pending: {relayed.errors[0][:80]}")
        except Refused as err:
            if "metadata" in str(err).lower():
                from onceflow.ledger.outbox import pending_sheet_rows
                from onceflow.sheets.relay import queue_target
                from onceflow.testing.sheets_emulator.limits import size, usage

                anchor = len("onceflow.claim") + 30 + len(queue.version)
                room = (book.metadata_limit or 0) - max(usage(book).values())
                # the room the wake-up's own write-backs free: their anchors go in its batch
                finishing = {
                    str(r.data.get("token"))
                    for r in pending_sheet_rows(ledger, queue_target(queue), 200)
                    if r.data.get("status") in {st.value for st in FINAL}
                }
                freed = sum(
                    size(m) for m in book.all_metadata() if m.key == "onceflow.claim" and m.value in finishing
                )
                if room + freed >= anchor:
                    run.violations.append(
                        f"claim refused whole at the cap with room for {(room + freed) // anchor} rows"
                        + (
                            f" ({freed} characters of it freed by the write-backs riding in it)"
                            if freed
                            else ""
                        )
                    )
            run.log.append(f"claim refused: {str(err)[:80]}")
            return
        except (RetriesExhausted, OSError) as err:
            run.log.append(f"claim gave up: {type(err).__name__}")
            return
        from onceflow.sheets.validation import judge_url

        now = Snapshot.from_values(values())  # read from the emulator's store, not through the queue
        for c in result.claims:
            beside = [judge_url(r).key for r in now.rows_with_token(c.token)]
            if beside != [c.row_key]:
                urls = [r.url for r in now.rows_with_token(c.token)]
                run.violations.append(f"claim bound {c.token} to {c.url!r}, but the token is beside {urls}")
            run.handed[c.token] = c
            pending.append(c.token)
        # the claim's INVALID and DUPLICATE leave through the outbox, as sheet_claim sends them
        run.rejected.update(r.token for r in result.rejected)
        _reject(run, queue, ledger, result.rejected, crash=crash)

    def resend_moved(limit: int, again: str, n: int) -> None:
        from onceflow.testing.sheets_emulator.faults import Fault

        known = run.tokens_seen | set(run.handed)

        def between_copies(store: Any) -> None:
            sheet = store.get(sid).sheet_by_title("queue")
            fresh = [
                i
                for i in range(1, len(sheet.rows))
                if str(sheet.get(i, 1) or "").startswith("PROCESSING #")
                and str(sheet.get(i, 1)).split("#", 1)[1] not in known
            ]
            if fresh:  # a NEW row pushes one just-claimed row down: the resend claims it too
                at = fresh[n % len(fresh)]
                sheet.insert_rows(at, 1)
                sheet.set(at, 0, f"https://news.example.com/s{seed}-m{n}")
                sheet.set(at, 1, "NEW")

        fault = emulator.faults.add(
            Fault(
                "apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"], after_apply=between_copies
            )
        )
        if again != "none":  # rows move again before the claim's next conditional write
            transport.arm_second(functools.partial(edit, again, 0.0, n))
        try:
            claim(limit)
        finally:
            fault.count = 0
            transport.arm_second(None)

    def bad_row(kind: str, pick: float, crash: str | None) -> None:
        """A row the claim must reject, then a wake-up (which may die between the verdicts' commit
        and their relay, or inside the relay); ``retyped``: an invalid URL typed into a row in
        flight (``sheet_reconcile`` makes it INVALID at rest)."""
        now = Snapshot.from_values(values())
        if kind == "retyped":
            flight = [r for r in now.rows if r.status is Status.PROCESSING]
            if flight:
                at = flight[int(pick * len(flight))].number - 1
                by_hand(lambda: batch_update(editor, sid, set_row(0, at, [f"not a url {seed}"])))
            return
        if kind == "duplicate":
            owned = [r.url for r in now.rows if r.url.startswith("https://")]
            url = owned[int(pick * len(owned))] if owned else ""
        else:
            url = "" if kind == "empty" else f"news.example.com/s{seed}-bad"
        at = 1 + int(pick * max(len(values()) - 1, 1))
        by_hand(lambda: batch_update(editor, sid, insert_rows(0, at), set_row(0, at, [url, "NEW"])))
        claim(rows, crash=crash)

    def work(token: str, *, crash: str | None = None, stale: bool = False, at: float = 0.0) -> None:
        _work(
            run,
            queue,
            ledger,
            run.handed[token],
            crash=crash,
            stale=stale,
            at=at,
            review=run.reviews.get(token),
        )

    for i, step in enumerate(generate(seed, rows=rows, steps=steps, moved=moved, review=review, bad=bad)):
        run.log.append(f"{i}: {step.kind} {step.args}")
        try:
            if step.kind == "claim":
                claim(step.args["limit"])
            elif step.kind == "fault":
                kind = step.args["fault"]
                options: dict[str, Any] = {"count": 1, "methods": [step.args["method"]], "retry_after": 0}
                if kind == "latency":
                    options["latency"] = 0.05
                emulator.faults.add(kind, **options)
            elif step.kind == "cap":
                from onceflow.testing.sheets_emulator.limits import usage

                anchor = len("onceflow.claim") + 30 + len(queue.version)
                store.metadata_limit = max(usage(book).values()) + step.args["room"] * anchor + anchor // 2
            elif step.kind == "resend_at_cap":
                from onceflow.testing.sheets_emulator.limits import usage

                # room for the first copy's k anchors and fewer than k more: the resend is refused
                limit = step.args["limit"]
                before = queue.rng.getstate()
                good, bad_rows = queue.pick_targets(Snapshot.from_values(values()), limit)
                queue.rng.setstate(before)
                k = len(good) + len(bad_rows)
                room = k + (step.args["room"] - limit) * k // (limit + 1)
                anchor = len("onceflow.claim") + 30 + len(queue.version)
                store.metadata_limit = max(usage(book).values()) + room * anchor + anchor // 2
                emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
                claim(step.args["limit"])
                store.metadata_limit = METADATA_LIMIT
            elif step.kind == "resend_moved":
                resend_moved(step.args["limit"], step.args["again"], step.args["n"])
            elif step.kind == "uncap":
                store.metadata_limit = METADATA_LIMIT
            elif step.kind == "edit":
                edit(step.args["edit"], step.args["pick"], step.args["n"])
            elif step.kind == "edit_in_flight" and pending:
                transport.armed.append(
                    functools.partial(edit, step.args["edit"], step.args["pick"], step.args["n"])
                )
                try:
                    work(pending.pop(rng.randrange(len(pending))))
                finally:
                    transport.armed.clear()
            elif step.kind == "bad_row":
                bad_row(step.args["bad"], step.args["pick"], step.args["crash"])
            elif step.kind == "review" and pending:
                token = pending.pop(rng.randrange(len(pending)))
                run.reviews[token] = step.args["decision"]
                work(token, crash=step.args["crash"])
            elif step.kind in ("work", "crash", "stale") and pending:
                token = pending.pop(rng.randrange(len(pending)))
                if step.kind == "crash":
                    work(token, crash=step.args["point"])
                else:
                    work(token, stale=step.kind == "stale")
        except _Crash:
            run.log.append(f"{i}: worker crashed")
        except Exception as err:  # a fault the code under test did not handle is a finding too
            run.violations.append(f"step {i} ({step.kind}) raised {type(err).__name__}: {err}")
        observe(f"after step {i}")
    # rest: no more faults, no cap; reconcile and work until nothing is in flight or NEW
    emulator.faults.clear()
    transport.armed.clear()
    store.metadata_limit = METADATA_LIMIT
    rest = time.time() + 7200  # every lease taken before now has expired
    for _ in range(6):
        claim(rows * 2)  # sheet_claim's wake-up: relays what waits, claims what is NEW
        snapshot = Snapshot.from_values(values())
        in_flight = [
            r for r in snapshot.rows if r.status in (Status.PROCESSING, Status.NEEDS_REVIEW) and r.token
        ]
        if not in_flight and not any(r.status is Status.NEW for r in snapshot.rows):
            break
        for r in in_flight:
            from onceflow.sheets.validation import judge_url

            token = str(r.token)
            verdict = judge_url(r)
            known = token in run.handed or token in transport.minted or token in run.rejected
            if known and not verdict.key:  # sheet_reconcile: a claimed row whose URL is not valid
                _reconcile_invalid(queue, ledger, r, verdict.reason)
                continue
            # a token a re-token minted, or a rejected row whose URL the editor changed before
            # its verdict reached it (not finished: it is no longer the row judged): sheet_reconcile
            # starts a run for a PROCESSING row without one
            if token not in run.handed and verdict.key and known:
                run.handed[token] = _adopted_claim(token, verdict.key, r)
            if token not in run.handed:
                continue  # reported below: no claim handed it out
            claim_now = run.handed[token]
            if verdict.key and verdict.key != claim_now.row_key:  # the URL changed: run it as reconcile would
                from dataclasses import replace

                run.handed[token] = replace(
                    claim_now, row_key=verdict.key, url=verdict.normalised_url or r.url
                )
            work(token, at=rest)  # no crash is scheduled at rest
        observe("at rest")
    queue.sweep_anchors()  # sheet_reconcile's sweep: anchors of rows the editor finished or retyped
    run.tokens_seen -= transport.minted  # made by a claim's re-token: run at rest, as reconcile does
    check(run, Snapshot.from_values(values()), book, ledger, target=f"{sid}/queue")
    if run.violations:
        raise ScheduleFailed(
            f"seed {seed}: "
            + "; ".join(run.violations)
            + f"\nreplay: python -m onceflow.testing.sheet_faults --seed {seed}"
            + (f" --moved {moved}" if moved else "")
            + (f" --review {review}" if review != REVIEW else "")
            + (f" --bad {bad}" if bad != BAD else "")
            + "\nschedule:\n  "
            + "\n  ".join(run.log)
        )
    return run


def _adopted_claim(token: str, key: str, row: Any) -> Claim:
    from datetime import datetime, timezone

    from onceflow.sheets.keys import pipeline_run_id
    from onceflow.sheets.protocol import Claim

    return Claim(token, key, row.url, pipeline_run_id(key, "v1"), row.number, datetime.now(timezone.utc))


def _reject(run: Run, queue: SheetQueue, ledger: Ledger, rejected: list[Any], *, crash: str | None) -> None:
    """``sheet_claim``'s verdicts: the claim's INVALID and DUPLICATE committed to the outbox, then
    relayed (:func:`onceflow.sheets.wakeup.wake_up`). ``crash="after_commit"``: the wake-up dies
    between the two; ``"after_relay_batch"``: inside the relay (:func:`_relay`)."""
    from onceflow.sheets.relay import claim_work_key, send_rows
    from onceflow.sheets.wakeup import CLAIM_STEP, rejection_writes

    writes = rejection_writes(queue, rejected)
    if not writes:
        return
    if crash is not None:
        ledger.enqueue(CLAIM_STEP, [(claim_work_key(str(w.payload["token"])), w) for w in writes])
        if crash == "after_relay_batch":
            _relay(run, queue, ledger, crash=crash)
        raise _Crash
    report = send_rows(queue, ledger, CLAIM_STEP, writes)
    if report.errors:
        run.log.append(f"verdicts left pending: {report.errors[0][:80]}")


def _reconcile_invalid(queue: SheetQueue, ledger: Ledger, row: Any, why: str) -> None:
    """``sheet_reconcile``'s repair of a claimed row whose URL is not valid: INVALID through the
    outbox (:func:`onceflow.sheets.reconcile.apply`)."""
    from datetime import datetime, timezone

    from onceflow.sheets import reconcile
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import send_rows

    fix = reconcile.Action(
        "transition", reconcile.CLAIMED_INVALID.format(why=why), row, new_status=Status.INVALID,
        fields=(("reason", why),),
    )  # fmt: skip
    reconcile.apply(
        [fix],
        queue,
        now=datetime.now(timezone.utc),
        create_run=lambda *_: "exists",
        send_rows=lambda writes: send_rows(queue, ledger, reconcile.RECONCILE_STEP, writes),
    )


def _relay(run: Run, queue: SheetQueue, ledger: Ledger, *, crash: str | None = None) -> bool:
    """A pass of the sheet relay over the queue's tab (the chain's, or ``sheet_claim``'s wake-up).

    ``crash="after_relay_batch"``: the relaying process dies after its sheet batches applied and
    before it marked the outbox rows relayed.
    """
    from onceflow.ledger.outbox import pending_sheet_rows
    from onceflow.sheets.relay import queue_target, relay_sheet_rows, settle_rows

    if crash == "after_relay_batch":
        settle_rows(queue, [row.data for row in pending_sheet_rows(ledger, queue_target(queue))])
        raise _Crash
    report = relay_sheet_rows(ledger, lambda _sid, _tab: queue, target=queue_target(queue))
    if report.errors:
        run.log.append(f"relay left rows pending: {report.errors[0][:80]}")
    return not report.errors


def _work(
    run: Run,
    queue: SheetQueue,
    ledger: Ledger,
    claim: Claim,
    *,
    crash: str | None,
    stale: bool,
    at: float,
    review: str | None = None,
) -> None:
    """What the article chain does for one claim, every row status through the ledger's outbox:
    with ``review``, ``mark_needs_review`` commits NEEDS_REVIEW and relays it, and the reviewer's
    ``reject`` commits REJECTED (then relayed) or ``approve`` goes on; a fenced keyed step
    publishes (create-only) and commits the row's DONE, or on a permanent error the item's
    ``needs_correction`` with the row's FAILED, then relays as ``write_back`` and
    ``ArticleStepOperator`` do. ``stale``: this try is paused past its lease, a newer try takes the
    item over and commits its DONE (relayed later, by its ``write_back``), then this one fails
    permanently. ``crash``: the worker dies at a named point (``after_commit``: between a commit
    and its relay, the first commit's under review; ``after_relay_batch``: inside the last relay,
    see :func:`_relay`)."""
    from onceflow.articles.errors import PermanentStepError
    from onceflow.articles.writeback import done_fields, failed_fields, needs_review_fields, rejected_fields
    from onceflow.ledger import Ledger as LedgerClass
    from onceflow.ledger.steps import InvalidInput, run_keyed_step
    from onceflow.sheets.ledger_link import KIND, work_key
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import queue_target, row_write
    from onceflow.testing.clock import FakeClock

    key = work_key(claim.row_key)
    clocked = ledger if not at else LedgerClass(ledger.engine, clock=FakeClock(start=at), migrate=False)
    target = queue_target(queue)

    def write(status: Status, fields: dict[str, str], *old: Status) -> Any:
        olds = old or (Status.PROCESSING, Status.NEEDS_REVIEW)
        return row_write(target, claim.token, status, fields, old=olds, row_key=claim.row_key)

    def failed(exc: Exception) -> list[Any]:
        return [write(Status.FAILED, failed_fields(str(exc)))]

    def step(
        name: str, work: Callable[[Any], Any], follow: Any, on: Ledger = clocked, owner: str = ""
    ) -> Any:
        # a run per claim: a retry of this claim's run reuses what it committed, another claim of
        # the same article (re-claimed after the editor typed NEW) does its steps again
        mine = f"try-{claim.token}-"
        return run_keyed_step(on, kind=KIND, work_key=key, step=name, owner=f"{mine}{owner or at}",
                              worker_version="v1", work=work, lease_seconds=60, reuse_prefix=mine,
                              follow_ups=lambda _result: [follow], invalid_follow_ups=failed)  # fmt: skip

    done = write(Status.DONE, done_fields(score=0.9, published_url=link(claim.row_key), run_id=claim.run_id))
    if review:
        low = needs_review_fields(score=0.41, reason="score 0.41 below 0.70 after polish")
        step(
            "mark_needs_review",
            lambda _lease: {"score": 0.41},
            write(Status.NEEDS_REVIEW, low, Status.PROCESSING),
        )
        if crash == "after_commit":
            raise _Crash
        if not _relay(run, queue, ledger):  # the task fails and is retried: no review before its row says so
            run.log.append(f"mark_needs_review of {claim.token} failed: its relay did not go through")
            return
        if review == "reject":
            no = rejected_fields(note="wrong register", score=0.41)
            step(
                "review",
                lambda _lease: {"decision": "rejected"},
                write(Status.REJECTED, no, Status.NEEDS_REVIEW),
            )
            _relay(run, queue, ledger, crash=crash)
            return

    def publish(lease: Any) -> dict[str, Any]:
        if crash == "after_lease":
            raise _Crash
        if claim.row_key not in run.published:
            run.published[claim.row_key] += 1
            run.published_by[claim.row_key] = claim.token
        if crash == "after_publish":
            raise _Crash
        if stale:
            later = LedgerClass(ledger.engine, clock=FakeClock(start=time.time() + 3600), migrate=False)
            step("publish", lambda _l: {"link": link(claim.row_key)}, done, on=later, owner="newer")
            raise PermanentStepError("too slow", step="publish")
        return {"link": link(claim.row_key)}

    try:
        step("publish", publish, done)
    except InvalidInput:
        _relay(run, queue, ledger)  # the FAILED committed with needs_correction (ArticleStepOperator)
        return
    except Exception as err:
        if isinstance(err, _Crash) or isinstance(err.__cause__, _Crash):
            raise _Crash from err
        run.log.append(f"work on {claim.token} stopped: {type(err).__name__}")
        return
    if crash == "after_commit":
        raise _Crash
    _relay(run, queue, ledger, crash=crash)  # write_back


def check(run: Run, snapshot: Any, book: Any, ledger: Ledger, target: str | None = None) -> None:
    """The promises over the final sheet, ledger and publications (appends to ``run.violations``).

    :param target: the queue's outbox target (``<spreadsheet id>/<tab>``): at rest none of its
        write-backs may still wait in the outbox.
    """
    from onceflow.ledger.errors import UnknownWorkItem
    from onceflow.ledger.outbox import pending_sheet_rows
    from onceflow.sheets.ledger_link import work_key
    from onceflow.sheets.model import Status
    from onceflow.sheets.validation import judge_url

    twice = [k for k, n in run.published.items() if n > 1]
    if twice:
        run.violations.append(f"published twice: {twice}")
    for row in snapshot.rows:
        verdict = judge_url(row)
        if row.status is Status.DONE:
            if (
                not verdict.key
                or row.get("published_url") != link(verdict.key)
                or verdict.key not in run.published
            ):
                run.violations.append(
                    f"row {row.number} DONE beside {row.url!r} with {row.get('published_url')!r}"
                )
        elif row.status is Status.FAILED and verdict.key:
            try:
                item = ledger.item(work_key(verdict.key))
            except UnknownWorkItem:
                continue
            if item.state == "done":
                run.violations.append(
                    f"row {row.number} FAILED while its article was published and committed"
                )
        elif row.status is Status.REJECTED and verdict.key:
            # the rejected claim's own work published nothing; an earlier claim of the article (the
            # editor typed NEW over its DONE row, and the checker runs a re-claim again) may have
            decided = [r for r in ledger.results(work_key(verdict.key)) if r.step == "review"]
            if not decided or run.published_by.get(verdict.key) == row.token:
                run.violations.append(
                    f"row {row.number} REJECTED beside {row.url!r}, whose article was "
                    + ("published" if decided else "never rejected in the ledger")
                )
        elif row.status is Status.INVALID and verdict.ok:
            run.violations.append(f"row {row.number} INVALID beside a valid URL {row.url!r}")
        elif row.status is Status.DUPLICATE and not row.get("reason").startswith("duplicate"):
            run.violations.append(f"row {row.number} DUPLICATE without its reason: {row.get('reason')!r}")
        elif row.status in (Status.PROCESSING, Status.NEEDS_REVIEW, Status.NEW):
            run.violations.append(f"row {row.number} not at rest: {row.status_cell.raw!r} beside {row.url!r}")
    orphans = sorted(run.tokens_seen - set(run.handed) - run.rejected)
    if orphans:
        run.violations.append(f"rows PROCESSING under tokens no claim handed out: {orphans}")
    if target is not None:
        waiting = [r.data.get("token") for r in pending_sheet_rows(ledger, target)]
        if waiting:
            run.violations.append(f"write-backs committed and never relayed: {waiting}")
    left = [m.value for m in book.all_metadata() if m.key == "onceflow.claim"]
    if left:
        run.violations.append(f"row anchors left at rest: {left}")


def run_many(
    seeds: Iterable[int], root: Path, *, workers: int | None = None, stop_after: int = 3
) -> list[str]:
    """Play ``seeds`` on ``workers`` forked processes (default: one per core), each with its own
    emulator and SQLite ledger under ``root/w<i>``; the messages of the schedules that failed.

    A schedule is CPU-bound in one Python process (client, emulator thread and ledger share its
    GIL), so processes are what make the 10,000 of ``make test-slow`` take half an hour instead of
    an hour on two cores. Each schedule replays alone (``--seed N``) as well: none depends on the
    ledger's earlier items. Forked, so each worker inherits the test process's network guard. A
    worker stops once ``stop_after`` of its seeds failed.
    """
    seeds = list(seeds)
    workers = workers or min(len(seeds), os.cpu_count() or 1) or 1
    stripes = [seeds[i::workers] for i in range(workers)]
    if workers == 1:
        return _play_stripe(stripes[0], root / "w0", stop_after)
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [
            pool.submit(_play_stripe, stripe, root / f"w{i}", stop_after) for i, stripe in enumerate(stripes)
        ]
        return [problem for future in futures for problem in future.result()]


def _play_stripe(seeds: list[int], root: Path, stop_after: int) -> list[str]:
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.testing.sheets_fixtures import SheetsEmulator

    root.mkdir(parents=True, exist_ok=True)
    emulator = SheetsEmulator(state=None)
    engine = create_ledger_engine(f"sqlite:///{root / 'ledger.db'}")
    failures: list[str] = []
    try:
        ledger = Ledger(engine)
        clients = services(emulator)
        for seed in seeds:
            emulator.faults.clear()
            try:
                run_schedule(emulator, ledger, seed, clients=clients)
            except ScheduleFailed as err:
                failures.append(str(err))
                if len(failures) >= stop_after:
                    break
    finally:
        engine.dispose()
        emulator.stop()
    return failures


def main(argv: list[str] | None = None) -> int:
    """``python -m onceflow.testing.sheet_faults --seed N [--count K]``: replay schedules."""
    import argparse
    import tempfile

    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.testing.sheets_fixtures import SheetsEmulator

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--moved", type=float, default=0.0, help="probability of a resend_moved step")
    parser.add_argument("--review", type=float, default=REVIEW, help="probability of review steps")
    parser.add_argument("--bad", type=float, default=BAD, help="probability of bad_row steps")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        emulator = SheetsEmulator(state=None)
        engine = create_ledger_engine(f"sqlite:///{tmp}/ledger.db")
        try:
            ledger = Ledger(engine)
            clients = services(emulator)
            for seed in range(args.seed, args.seed + args.count):
                run_schedule(
                    emulator,
                    ledger,
                    seed,
                    clients=clients,
                    moved=args.moved,
                    review=args.review,
                    bad=args.bad,
                )
                print(f"seed {seed}: ok")
        except ScheduleFailed as err:
            print(err)
            return 1
        finally:
            engine.dispose()
            emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
