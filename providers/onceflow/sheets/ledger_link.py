"""Claimed sheet rows as ledger work items: one item per article, keyed by the row's stable key.

``sheet_claim`` registers each row it claimed (kind ``article``, key ``article:<row key>``, the
claim's run conf as payload) right after the sheet claim and before the run exists, so the three
records of an article are written in order: sheet claim, ledger item, Airflow run. Each later
write is idempotent and a crash between two leaves a gap that ``sheet_reconcile`` closes.

Registration never re-opens a finished item: processing an article again is a recheck (the
``recheck`` DAG) or a new processing version, not a second claim.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.ledger import states
from onceflow.ledger.errors import IllegalTransition, UnknownWorkItem
from onceflow.sheets.keys import BATCH_RUN_KEY, parse_run_id, pipeline_run_id

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from onceflow.ledger.core import Ledger

log = logging.getLogger(__name__)

KIND = "article"
#: The step ``article_pipeline`` commits for a claimed row (the chain's steps come later).
CLAIM_STEP = "read_claimed_row"
#: The step the reconciler records when the sheet says DONE and the ledger missed it.
SHEET_DONE_STEP = "sheet_done"
#: Steps whose commit carries the row's final outcome to the outbox (DONE; REJECTED).
OUTCOME_STEPS = ("publish", "review")


def work_key(row_key: str) -> str:
    """``article:<row key>``: the ledger key of the article a row points at."""
    if not row_key:
        raise ValueError("a claimed row without a row key cannot be registered in the ledger")
    return f"{KIND}:{row_key}"


@dataclass(frozen=True)
class ClaimRecord:
    """What the ledger stores about one claim (the payload is the run's conf)."""

    row_key: str
    row_number: int
    token: str
    conf: dict[str, str]


def register_claims(
    ledger: Ledger, claims: Iterable[ClaimRecord], *, actor: str = states.PRODUCER
) -> list[str]:
    """Create a pending ``article`` item per claim; return the keys that were new.

    An existing item (registered by an earlier attempt, a second claimer or the reconciler, or
    finished earlier) is left as it is.
    """
    created = []
    for claim in claims:
        key = work_key(claim.row_key)
        reason = f"claimed in the sheet: row {claim.row_number}, claim token {claim.token}"
        if ledger.add(KIND, key, payload=claim.conf, reason=reason, actor=actor):
            created.append(key)
    return created


@dataclass(frozen=True)
class LedgerView:
    """What the sheet reconciler needs to know about an article's ledger item.

    :param batch_run: the ``article_batch`` run the item was registered for (its payload's
        ``batch_run_id``), with :attr:`batch_token` the claim it was registered under; ``None``
        for the per-article lane.
    :param outcome: a batch item only: whether a step that carries the row's final outcome to the
        outbox (``publish``, a rejecting ``review``) was committed at the payload's processing
        version; a callable is asked only when the reconciler needs the answer (:meth:`has_outcome`:
        one more query, for the few rows whose batch run has ended), not on every pass's every row.
    """

    state: str
    lease_expired: bool
    reason: str
    fencing_token: int
    batch_run: str | None = None
    batch_token: str | None = None
    outcome: bool | Callable[[], bool] = False

    def has_outcome(self) -> bool:
        """:attr:`outcome`, asked now if it is a callable."""
        return bool(self.outcome() if callable(self.outcome) else self.outcome)

    def batch_of(self, token: str | None) -> str | None:
        """The batch run that carries the claim ``token``, or ``None`` (another claim registered
        the item, or it is no batch's)."""
        return self.batch_run if self.batch_run and token and self.batch_token == token else None


def ledger_view(ledger: Ledger, row_key: str) -> LedgerView | None:
    """The item of ``row_key`` as the reconciler sees it, or ``None`` if the ledger has none."""
    try:
        item = ledger.item(work_key(row_key))
    except UnknownWorkItem:
        return None
    expired = item.state == states.LEASED and (
        item.lease_expires_at is None or item.lease_expires_at <= ledger.clock.now()
    )
    why = item.reason or ""
    if item.last_error:  # a worker's report: the exception class says what kind of failure
        plain = item.last_error_class in (None, "InvalidInput")
        why = item.last_error if plain else f"{item.last_error_class}: {item.last_error}"
    payload = conf_payload(item.payload)
    version = payload.get("processing_version")

    def outcome() -> bool:
        results = ledger.results(item.work_key)
        return any(r.step in OUTCOME_STEPS and r.processing_version == version for r in results)

    batch = payload.get(BATCH_RUN_KEY) or None
    return LedgerView(
        item.state, expired, why, item.fencing_token, batch, payload.get("claim_token"), outcome
    )


def batch_claim(ledger: Ledger, run_id: str) -> str | None:
    """The claim token of the batch that owns the article of the ``article_pipeline`` run id
    ``run_id`` (its item registered for a batch at that version), or ``None``: in the batch lane
    the item, not a per-article run, says which of two rows of one URL owns the article."""
    parsed = parse_run_id(run_id)
    if parsed is None:
        return None
    try:
        payload = conf_payload(ledger.item(work_key(parsed[0])).payload)
    except UnknownWorkItem:
        return None
    if not payload.get(BATCH_RUN_KEY) or payload.get("processing_version") != parsed[1]:
        return None
    return payload.get("claim_token") or None


def conf_payload(item_payload: Any) -> dict[str, str]:
    """The claim conf stored on an item (rechecks start runs with only the work key)."""
    if not isinstance(item_payload, dict):
        return {}
    return {str(k): str(v) for k, v in item_payload.items()}


def owner_claim(ledger: Ledger, key: str, run_claim: Callable[[str], str | None]) -> dict[str, str]:
    """The claim conf a run started with only a work key (a recheck) works on.

    The item's payload is the conf of whichever claimer registered the article first, and that
    need not be the claim that owns it: a claimer B can register ``article:K`` and die (or step
    aside) before creating its run, while claimer A of the same URL creates the run with its own
    token; B's row is then marked DUPLICATE, and a recheck following the payload would work on it.
    So the token is the one in the article's run conf (``run_claim``: run id -> token, the same
    authority ``sheet_reconcile`` keeps a row by), else the one the newest committed claim step
    recorded (the owner run's row; it outlives Airflow's metadata clean-up), else the payload's.
    """
    conf = conf_payload(ledger.item(key).payload)
    row_key, version = conf.get("row_key", ""), conf.get("processing_version", "")
    token = run_claim(pipeline_run_id(row_key, version)) if row_key and version else None
    if not token:
        done = [r for r in ledger.results(key) if r.step == CLAIM_STEP and isinstance(r.payload, dict)]
        newest = max(done, key=lambda r: (r.committed_at, r.fencing_token), default=None)
        token = str((newest.payload if newest else {}).get("claim_token") or "")
    if token and token != conf.get("claim_token"):
        log.info("%s: the payload names claim %s; the run's claim is %s", key, conf.get("claim_token"), token)
        conf["claim_token"] = token
    return conf


def repair(
    ledger: Ledger, kind: str, *, conf: dict[str, str], row_number: int, reason: str, published_url: str = ""
) -> bool:
    """Carry out one of the sheet reconciler's ledger actions; ``True`` when the ledger changed.

    Every change is a ledger transition with the reconciler as actor; a repair another pass (or
    another reconciler) already made changes nothing and returns ``False``. The item is read
    again here, but it can still move between that read and the transition (``ledger_reconcile``
    expires the same lease on the same schedule, a worker leases the item): an expiry someone else
    made is taken as done, and a transition the item's new state no longer allows
    (``IllegalTransition``) leaves it to whoever moved it and returns ``False``.

    :param kind: ``ledger_register``, ``ledger_abandon`` or ``ledger_record_done``.
    :param conf: the row's run conf (claim token, row key, URL, ...).
    """
    row_key = conf.get("row_key", "")
    key = work_key(row_key)
    if kind == "ledger_register":
        record = ClaimRecord(row_key, row_number, conf.get("claim_token", ""), conf)
        return bool(register_claims(ledger, [record], actor=states.RECONCILER))
    view = ledger_view(ledger, row_key)
    if view is None:
        return False
    state = view.state
    try:
        if state == states.LEASED:
            if not view.lease_expired:
                return False  # a live holder decides; the next pass looks again
            expire = f"{reason} (lease had expired)"
            try:
                state = ledger.transition(key, "expire", states.RECONCILER, reason=expire).state
            except IllegalTransition:
                # moved on since it was read: ledger_reconcile expired it first, or a worker took
                # it over; go on from where it is now
                state = ledger.item(key).state
        if kind == "ledger_abandon":
            if state != states.PENDING:
                return False
            ledger.transition(key, "abandon", states.RECONCILER, reason=reason)
            return True
    except IllegalTransition as err:  # moved on between the read and the repair: not ours to settle
        log.info("ledger item %s moved on before the repair (%s); leaving it", key, err)
        return False
    if kind == "ledger_record_done":
        return ledger.record_result(
            key,
            SHEET_DONE_STEP,
            conf.get("processing_version", "v1"),
            view.fencing_token,  # expiry keeps the token
            {"published_url": published_url, "source": "sheet"},
            reason=reason,
        )
    raise ValueError(f"not a ledger repair: {kind!r}")
