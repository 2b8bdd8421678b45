"""The state model of a work item: every allowed transition, in one table.

Each row says which event moves an item from which states to which state, which actor roles may
perform it, what must already hold (named preconditions, checked by :func:`check`) and whether it
may happen again. Anything not in the table is illegal: :func:`check` raises
:class:`~onceflow.ledger.errors.IllegalTransition` before anything is written.

States::

    pending ──claim──▶ leased ──complete──▶ done
       ▲  ▲             │ │ │                 │
       │  └─retry/release┘ │ └─invalid──▶ needs_correction ──correct──▶ pending
       │                   └─give_up──▶ failed
       │                   (expired lease, no attempts left: give_up_expired──▶ failed)
       └──────── recheck (from done, failed, needs_correction) / expire (reconciler)
    pending ──abandon (reconciler: the source gave the work up)──▶ failed
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.ledger.errors import IllegalTransition

if TYPE_CHECKING:
    from collections.abc import Mapping

PENDING = "pending"
LEASED = "leased"
DONE = "done"
FAILED = "failed"
NEEDS_CORRECTION = "needs_correction"
CANCELLED = "cancelled"
STATES = frozenset({PENDING, LEASED, DONE, FAILED, NEEDS_CORRECTION, CANCELLED})
TERMINAL = frozenset({DONE, FAILED, NEEDS_CORRECTION, CANCELLED})

# Actor roles. A worker is whoever holds a lease; the producer creates work (sheet_claim, a DAG);
# the reconciler repairs broken invariants; recheck re-opens finished work; operator is a human.
WORKER = "worker"
PRODUCER = "producer"
RECONCILER = "reconciler"
RECHECK = "recheck"
OPERATOR = "operator"
ACTORS = frozenset({WORKER, PRODUCER, RECONCILER, RECHECK, OPERATOR})


@dataclass(frozen=True)
class Transition:
    """One row of the state table.

    :param event: the name recorded in ``transitions.event``.
    :param sources: states the item may be in (``None`` means "does not exist yet").
    :param target: state afterwards (``None``: unchanged, the event is only recorded).
    :param actors: roles allowed to perform it.
    :param requires: preconditions, see :data:`PRECONDITIONS`.
    :param repeatable: whether the event may happen again to the same item while nothing else
        changed; a non-repeatable event that is repeated with the same inputs is an idempotent
        no-op (for example a second ``complete`` with the same lease), never a second change.
    :param doc: why this transition exists.
    """

    event: str
    sources: frozenset[str | None]
    target: str | None
    actors: frozenset[str]
    requires: tuple[str, ...]
    repeatable: bool
    doc: str


def _t(
    event: str,
    sources: set[str | None],
    target: str | None,
    actors: set[str],
    requires: tuple[str, ...],
    repeatable: bool,
    doc: str,
) -> Transition:
    return Transition(event, frozenset(sources), target, frozenset(actors), requires, repeatable, doc)


STATE_TABLE: tuple[Transition, ...] = (
    _t(
        "create",
        {None},
        PENDING,
        {PRODUCER, RECHECK, RECONCILER, OPERATOR},
        (),
        False,
        "New work becomes visible; a second create of the same key is a no-op.",
    ),
    _t(
        "claim",
        {PENDING},
        LEASED,
        {WORKER},
        ("available", "version_ok"),
        True,
        "Grant a lease: fencing token +1, attempts +1, lease expiry = now + lease seconds.",
    ),
    _t(
        "reclaim_expired",
        {LEASED},
        LEASED,
        {WORKER},
        ("lease_expired", "version_ok"),
        True,
        "A claimer takes over an expired lease directly: new token, so the old holder is fenced.",
    ),
    _t(
        "heartbeat",
        {LEASED},
        LEASED,
        {WORKER},
        ("lease_current",),
        True,
        "The holder extends its lease (not written to transitions: it is not a state change).",
    ),
    _t(
        "release",
        {LEASED},
        PENDING,
        {WORKER},
        ("lease_current",),
        False,
        "The holder gives the item back untouched (shutdown, wrong moment); available at once.",
    ),
    _t(
        "complete",
        {LEASED},
        DONE,
        {WORKER},
        ("lease_current", "result_written"),
        False,
        "The holder committed its result (and follow-ups) in the same transaction.",
    ),
    _t(
        "retry",
        {LEASED},
        PENDING,
        {WORKER},
        ("lease_current", "attempts_left"),
        True,
        "Transient failure: back to pending with a later available-at time (backoff).",
    ),
    _t(
        "give_up",
        {LEASED},
        FAILED,
        {WORKER},
        ("lease_current", "attempts_exhausted"),
        False,
        "Transient failures used every attempt: permanent failure, waits for a recheck.",
    ),
    _t(
        "invalid_input",
        {LEASED},
        NEEDS_CORRECTION,
        {WORKER},
        ("lease_current", "has_reason"),
        False,
        "The input itself is wrong: retrying cannot help, a human must correct it.",
    ),
    _t(
        "commit_refused",
        {PENDING, LEASED, DONE, FAILED, NEEDS_CORRECTION, CANCELLED},
        None,
        {WORKER},
        ("lease_stale",),
        True,
        "A late holder tried to write with an old fencing token; recorded, nothing else changes.",
    ),
    _t(
        "expire",
        {LEASED},
        PENDING,
        {RECONCILER},
        ("lease_expired", "attempts_left"),
        False,
        "Reconciliation: an expired lease still marked active goes back to pending.",
    ),
    _t(
        "give_up_expired",
        {LEASED},
        FAILED,
        {WORKER, RECONCILER},
        ("lease_expired", "attempts_exhausted", "has_reason"),
        False,
        "A poison item: the lease of its last attempt expired (its worker crashed every time), "
        "so a claimer or the reconciler fails it with the reason instead of trying again.",
    ),
    _t(
        "repair_follow_up",
        {DONE},
        None,
        {RECONCILER},
        ("has_reason",),
        True,
        "Reconciliation: a committed result's promised follow-up was missing and was re-created.",
    ),
    _t(
        "record_result",
        {PENDING, LEASED, DONE, FAILED},
        DONE,
        {RECONCILER},
        ("result_written", "has_reason"),
        False,
        "Reconciliation: a sink committed a result (e.g. a warehouse load) that the ledger missed.",
    ),
    _t(
        "abandon",
        {PENDING},
        FAILED,
        {RECONCILER},
        ("has_reason",),
        False,
        "Reconciliation: the source gave the work up (a sheet row marked FAILED); nothing will run it.",
    ),
    _t(
        "correct",
        {NEEDS_CORRECTION},
        PENDING,
        {OPERATOR, PRODUCER},
        ("has_reason",),
        False,
        "The input was corrected; the item runs again.",
    ),
    _t(
        "recheck",
        {DONE, FAILED, NEEDS_CORRECTION},
        PENDING,
        {RECHECK, OPERATOR},
        ("has_reason",),
        True,
        "Re-open finished work with a recorded reason, target version and priority.",
    ),
    _t(
        "cancel",
        {PENDING, NEEDS_CORRECTION, FAILED},
        CANCELLED,
        {OPERATOR},
        ("has_reason",),
        False,
        "Withdraw work that must not run.",
    ),
)

BY_EVENT: Mapping[str, Transition] = {t.event: t for t in STATE_TABLE}

# Events only a lease holder performs, through claim/heartbeat/commit_result/fail/...: never
# through the generic Ledger.transition(), which has no fencing token to check.
LEASE_EVENTS = frozenset(t.event for t in STATE_TABLE if t.actors == {WORKER})


def _lease_current(item: Mapping[str, Any], ctx: Mapping[str, Any]) -> bool:
    return item["state"] == LEASED and item["fencing_token"] == ctx.get("token")


PRECONDITIONS: Mapping[str, Any] = {
    "available": lambda item, ctx: item["available_at"] <= ctx["now"],
    "version_ok": lambda item, ctx: item.get("required_version") in (None, ctx.get("worker_version")),
    "lease_current": _lease_current,
    "lease_stale": lambda item, ctx: not _lease_current(item, ctx),
    "lease_expired": lambda item, ctx: (
        item["lease_expires_at"] is not None and item["lease_expires_at"] <= ctx["now"]
    ),
    "result_written": lambda item, ctx: bool(ctx.get("result_written")),
    "attempts_left": lambda item, ctx: item["attempts"] < item["max_attempts"],
    "attempts_exhausted": lambda item, ctx: item["attempts"] >= item["max_attempts"],
    "has_reason": lambda item, ctx: bool(ctx.get("reason")),
}


def check(
    event: str, item: Mapping[str, Any] | None, actor: str, ctx: Mapping[str, Any], work_key: str = "?"
) -> Transition:
    """Return the table row for ``event`` if it is legal now, else raise ``IllegalTransition``.

    :param event: the event name.
    :param item: the work item row as a mapping (``None`` when it does not exist).
    :param actor: the role performing it.
    :param ctx: ``now``, ``token``, ``worker_version``, ``reason``, ``result_written``.
    """
    state = None if item is None else item["state"]
    key = work_key if item is None else item["work_key"]
    row = BY_EVENT.get(event)
    if row is None:
        raise IllegalTransition(key, event, state, actor, "no such event in the state table")
    if actor not in row.actors:
        raise IllegalTransition(key, event, state, actor, f"only {sorted(row.actors)} may do this")
    if state not in row.sources:
        raise IllegalTransition(
            key, event, state, actor, f"allowed only from {sorted(map(str, row.sources))}"
        )
    if item is not None:
        for name in row.requires:
            if not PRECONDITIONS[name](item, ctx):
                raise IllegalTransition(key, event, state, actor, f"precondition {name!r} does not hold")
    return row


def allowed(event: str, from_state: str | None, to_state: str | None, actor: str) -> bool:
    """Whether a recorded transition row is one the table permits (used by audits and tests)."""
    row = BY_EVENT.get(event)
    if row is None or actor not in row.actors or from_state not in row.sources:
        return False
    expected = from_state if row.target is None else row.target
    return to_state == expected
