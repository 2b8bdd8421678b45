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
4. on :class:`InvalidInput` moves the item to ``needs_correction`` with the reason; on any other
   error records a transient failure (the Airflow task's retry owns the timing) and re-raises.

Nothing here imports Airflow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.ledger import states
from onceflow.ledger.errors import StaleFenceError, UnknownWorkItem
from onceflow.ledger.keyed import Heartbeat

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import Lease


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
) -> StepOutcome:
    """Run ``work`` once for ``work_key`` under a ledger lease and commit its result (see module).

    :param work: does the step with the lease in hand and returns the result payload (JSON).
    :raises LeaseHeld: another attempt's lease is current (it is still working).
    :raises StaleFenceError: this attempt's lease was taken over before it committed.
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
    try:
        with Heartbeat(lease):
            result = work(lease)
    except InvalidInput as exc:
        with contextlib.suppress(StaleFenceError):  # a newer attempt owns the item; refusal recorded
            ledger.mark_invalid(lease, str(exc) or type(exc).__name__)
        raise
    except Exception as exc:
        with contextlib.suppress(StaleFenceError):
            ledger.fail(lease, exc, backoff_seconds=0)  # the Airflow task's retry owns the timing
        raise
    record = ledger.commit_result(lease, step, result)
    return StepOutcome(record.payload, record.fencing_token, repeated=False)
