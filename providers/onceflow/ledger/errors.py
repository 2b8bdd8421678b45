"""Exceptions raised by the work ledger."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of every ledger error."""


class IllegalTransition(LedgerError):
    """The state model does not allow this event from this state for this actor.

    Raised before anything is written: the transaction is rolled back and the item is unchanged.
    """

    def __init__(self, work_key: str, event: str, state: str | None, actor: str, why: str) -> None:
        self.work_key = work_key
        self.event = event
        self.state = state
        self.actor = actor
        self.why = why
        super().__init__(f"{event!r} by {actor!r} on {work_key!r} in state {state!r} is illegal: {why}")


class StaleFenceError(LedgerError):
    """A write carried a fencing token older than the item's current lease.

    The refusal itself is recorded as a ``commit_refused`` transition, so the late attempt is visible.
    """

    def __init__(self, work_key: str, token: int, current_token: int, state: str) -> None:
        self.work_key = work_key
        self.token = token
        self.current_token = current_token
        self.state = state
        super().__init__(
            f"stale fencing token {token} for {work_key!r}: current token is {current_token}, state {state!r}"
        )


class UnknownWorkItem(LedgerError):
    """No work item has this key."""


class LeaseHeld(LedgerError):
    """Another owner holds a current lease on the item asked for by key; try again later."""

    def __init__(self, work_key: str, owner: str | None, token: int, expires_at: float | None) -> None:
        self.work_key = work_key
        self.owner = owner
        self.token = token
        self.expires_at = expires_at
        super().__init__(
            f"{work_key!r} is leased to {owner!r} (token {token}) until {expires_at}; retry after it "
            "commits or its lease expires"
        )


class WrongVersion(LedgerError):
    """The item requires another processing version than the worker runs: leave it for a worker
    running that version (nothing was written). Not a failure of the item or of the worker."""

    def __init__(self, work_key: str, required: str, worker_version: str) -> None:
        self.work_key = work_key
        self.required = required
        self.worker_version = worker_version
        super().__init__(
            f"{work_key!r} requires processing version {required!r}; this worker runs {worker_version!r}: "
            f"left for a worker running {required!r}"
        )


class LedgerSchemaError(LedgerError):
    """The ledger database cannot be brought to the code's schema as it is (the message says why)."""
