"""One step of one named work item, run by an Airflow task: lease, work, fenced commit.

``claim`` suits a worker that takes whatever is next; a task of a per-item DAG run (one
``article_pipeline`` run per article) knows its item. :func:`run_keyed_step`:

1. returns the stored result when the item is ``done`` with a result for this step and
   processing version committed by an owner starting with ``reuse_prefix`` (the same Airflow
   run): a retry after the commit repeats nothing, while a recheck's run does the step again;
2. leases the item (created if missing, re-opened if it finished under another version), fencing
   token + 1, and heartbeats while the work runs;
3. commits the work's payload fenced by the lease: a late attempt whose lease was taken over gets
   ``StaleFenceError`` and the ledger records the refusal;
4. on :class:`InvalidInput` moves the item to ``needs_correction`` with the reason (a late attempt
   gets ``StaleFenceError`` instead, chained to its error: its verdict is not the item's); on any other
   error records a transient failure (the Airflow task's retry owns the timing) and re-raises;
5. with a ``shutdown`` flag (an Airflow task's ``on_kill``, or SIGTERM through
   :meth:`GracefulShutdown.installed`), hands the lease back the moment shutdown is requested
   (:func:`hand_back_on_shutdown`: ``release``, reason :data:`HANDED_BACK`, the item pending and
   available at once, the attempt not spent) and then commits nothing: the next attempt need not
   wait for the lease to expire. Airflow kills a task 5 s after its SIGTERM, so waiting for the
   work to finish is not an option.

Nothing here imports Airflow.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.ledger import states
from onceflow.ledger.errors import StaleFenceError, UnknownWorkItem
from onceflow.ledger.keyed import Heartbeat
from onceflow.ledger.worker import ShutdownRequested

if TYPE_CHECKING:
    from collections.abc import Sequence

    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import FollowUp, Lease
    from onceflow.shutdown import GracefulShutdown

log = logging.getLogger(__name__)

#: Reason of the ``release`` transition when a stopped task hands its lease back.
HANDED_BACK = "task stopped (SIGTERM): lease handed back"
#: How long the shutdown callback waits for the release; Airflow sends SIGKILL 5 s after SIGTERM.
HAND_BACK_WAIT = 3.0


class InvalidInput(ValueError):
    """The item's input is wrong; retrying cannot help (``needs_correction``)."""


@dataclass(frozen=True)
class StepOutcome:
    """What :func:`run_keyed_step` did.

    :param payload: the committed (or earlier stored) result.
    :param token: the fencing token the result was committed under.
    :param repeated: ``True`` when an earlier commit was returned and no work ran.
    """

    payload: Any
    token: int
    repeated: bool


@dataclass
class HandBack:
    """The hand-back of one lease: whether shutdown was requested and what the release did."""

    lease: Lease
    requested: bool = False
    released: bool | None = None
    error: BaseException | None = None

    def release(self, ledger: Ledger, reason: str) -> None:
        """Hand the lease back now (on SIGTERM or failure); an error is kept and logged, and the lease then expires as usual."""
        try:
            self.released = ledger.release(self.lease, reason)
        except Exception as exc:  # the lease then expires as usual; say why it did not go back
            self.error = exc
            log.exception("could not hand back the lease of %s", self.lease.work_key)
            return
        if self.released:
            log.warning("shutdown: lease of %s (token %s) handed back", self.lease.work_key, self.lease.token)
        else:
            log.warning("shutdown: lease of %s was no longer held; nothing to hand back", self.lease.work_key)


@contextlib.contextmanager
def hand_back_on_shutdown(
    ledger: Ledger,
    lease: Lease,
    shutdown: GracefulShutdown | None,
    *,
    reason: str = HANDED_BACK,
    wait: float = HAND_BACK_WAIT,
) -> Iterator[HandBack]:
    """Release ``lease`` as soon as ``shutdown`` is requested while the block runs.

    The request usually arrives in a signal handler on the main thread, which may be inside a
    ledger transaction or the connection pool's lock; so the release runs in its own thread and
    the handler waits at most ``wait`` seconds for it (then the interrupted code goes on, lets go
    of its locks, and the release finishes). A main thread blocked in C code (a warehouse write
    waiting for a lock) would run the handler only after that call, so SIGTERM is also watched
    through the wakeup fd (:meth:`GracefulShutdown.watching`). The caller checks
    :attr:`HandBack.requested` before committing: after a hand-back the lease is no longer its own.
    """
    handback = HandBack(lease)
    if shutdown is None:
        yield handback
        return

    def release_now() -> None:
        handback.requested = True
        thread = threading.Thread(
            target=handback.release, args=(ledger, reason), name=f"hand back {lease.work_key}", daemon=True
        )
        thread.start()
        thread.join(wait)

    # watching(): a main thread blocked in a driver call would run the SIGTERM handler too late
    with shutdown.on_request(release_now), shutdown.watching():
        yield handback


def stored_result(
    ledger: Ledger, work_key: str, step: str, version: str, reuse_prefix: str = ""
) -> tuple[Any, int] | None:
    """The result of ``step`` at ``version`` if the item is ``done`` with it and the result's
    committer starts with ``reuse_prefix``, else ``None``."""
    try:
        item = ledger.item(work_key)
    except UnknownWorkItem:
        return None
    if item.state != states.DONE:
        return None
    for result in ledger.results(work_key):
        mine = (result.committed_by or "").startswith(reuse_prefix)
        if result.step == step and result.processing_version == version and mine:
            return result.payload, result.fencing_token
    return None


def run_keyed_step(
    ledger: Ledger,
    *,
    kind: str,
    work_key: str,
    step: str,
    owner: str,
    worker_version: str,
    work: Callable[[Lease], Any],
    lease_seconds: float = 300.0,
    payload: Any = None,
    reuse_prefix: str = "",
    shutdown: GracefulShutdown | None = None,
    follow_ups: Callable[[Any], Sequence[FollowUp]] | None = None,
    invalid_follow_ups: Callable[[InvalidInput], Sequence[FollowUp]] | None = None,
) -> StepOutcome:
    """Run ``work`` once for ``work_key`` under a ledger lease and commit its result (see module).

    :param work: does the step with the lease in hand and returns the result payload (JSON).
    :param shutdown: requested when the task is being stopped: the lease goes back at once.
    :param follow_ups: the follow-ups of a result (given the payload ``work`` returned), committed
        in the result's transaction: a try whose lease was taken over commits neither.
    :param invalid_follow_ups: likewise for an :class:`InvalidInput` (given the error), committed
        with the item's ``needs_correction`` (the row's FAILED).
    :raises LeaseHeld: another attempt's lease is current (it is still working).
    :raises StaleFenceError: this attempt's lease was taken over before it committed.
    :raises ShutdownRequested: shutdown was requested; the lease was handed back, nothing committed.
    """
    earlier = stored_result(ledger, work_key, step, worker_version, reuse_prefix)
    if earlier is not None:
        return StepOutcome(earlier[0], earlier[1], repeated=True)
    lease = ledger.lease_key(
        kind,
        work_key,
        owner,
        lease_seconds,
        worker_version,
        reopen_reason=f"{step} again at version {worker_version} by {owner}",
        payload=payload,
    )
    with hand_back_on_shutdown(ledger, lease, shutdown) as handback:
        try:
            with Heartbeat(lease):
                result = work(lease)
        except Exception as exc:
            if handback.requested:  # the work was cut short by the stop; the item went back
                raise ShutdownRequested(_stopped(work_key, step)) from exc
            if isinstance(exc, InvalidInput):
                # a newer attempt owns the item (refusal recorded): say so instead of the verdict,
                # which is no longer this attempt's to give (its caller would write it to the row)
                ledger.mark_invalid(
                    lease,
                    str(exc) or type(exc).__name__,
                    step=step,
                    follow_ups=invalid_follow_ups(exc) if invalid_follow_ups else (),
                )
            else:
                with contextlib.suppress(StaleFenceError):
                    ledger.fail(lease, exc, backoff_seconds=0)  # the Airflow task's retry owns the timing
            raise
        if handback.requested:
            raise ShutdownRequested(_stopped(work_key, step))
        record = ledger.commit_result(lease, step, result, follow_ups(result) if follow_ups else ())
    return StepOutcome(record.payload, record.fencing_token, repeated=False)


def _stopped(work_key: str, step: str) -> str:
    return f"stopped during {step} of {work_key}: the lease was handed back, nothing was committed"
