"""A worker loop over the ledger, with graceful shutdown.

On SIGTERM (or :meth:`GracefulShutdown.request`, which an Airflow operator's ``on_kill`` calls)
the worker stops claiming. The item in hand is finished and committed if the handler returns
(recorded as ``complete`` with reason "finished during shutdown"); a handler that sees
``shutdown.requested`` and raises :class:`ShutdownRequested` has its lease released instead
(recorded as ``release`` with reason "shutdown"). Either way the ledger says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.ledger.errors import StaleFenceError
from onceflow.shutdown import GracefulShutdown

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import FollowUp, Lease

SHUTDOWN_FINISHED = "finished during shutdown"
SHUTDOWN_RELEASED = "shutdown"


class ShutdownRequested(Exception):
    """Raised by a handler that stops work early because shutdown was requested."""


class InvalidInput(Exception):
    """Raised by a handler when the input itself is wrong (the item needs correction)."""


@dataclass
class Outcome:
    """What a handler returns: the result payload and its follow-ups."""

    payload: Any
    follow_ups: list[FollowUp] = field(default_factory=list)


Handler = Callable[["Lease"], "Outcome | Any"]


@dataclass
class WorkerReport:
    """What a worker loop did with each item it leased."""

    completed: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    stopped_by_shutdown: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the task's XCom)."""
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class LedgerWorker:
    """Claim, handle and commit items of one kind until none are left, a limit, or shutdown.

    :param handler: called with the lease; returns an :class:`Outcome` (or a bare payload).
        Raise :class:`InvalidInput` for bad input, :class:`ShutdownRequested` to give the item
        back; any other exception is a transient failure (retry with backoff).
    """

    ledger: Ledger
    kind: str
    step: str
    owner: str
    worker_version: str
    handler: Handler
    lease_seconds: float = 60.0
    lane: str = "new"
    shutdown: GracefulShutdown = field(default_factory=GracefulShutdown)

    def run(self, max_items: int | None = None) -> WorkerReport:
        """Lease and handle items until none is left, ``max_items`` were handled or a shutdown is requested."""
        report = WorkerReport()
        handled = 0
        while max_items is None or handled < max_items:
            if self.shutdown.requested:
                report.stopped_by_shutdown = True
                break
            lease = self.ledger.claim(
                self.kind, self.owner, self.lease_seconds, self.worker_version, lane=self.lane
            )
            if lease is None:
                break
            handled += 1
            self._handle(lease, report)
        report.stopped_by_shutdown = report.stopped_by_shutdown or self.shutdown.requested
        return report

    def _handle(self, lease: Lease, report: WorkerReport) -> None:
        try:
            outcome = self.handler(lease)
        except ShutdownRequested:
            self.ledger.release(lease, SHUTDOWN_RELEASED)
            report.released.append(lease.work_key)
            return
        except InvalidInput as exc:
            reason = str(exc) or "invalid input"
            if self._guarded(report, lease, lambda: self.ledger.mark_invalid(lease, reason)):
                report.invalid.append(lease.work_key)
            return
        except Exception as exc:
            error: BaseException = exc
            if self._guarded(report, lease, lambda: self.ledger.fail(lease, error)):
                report.retried.append(lease.work_key)
            return
        if not isinstance(outcome, Outcome):
            outcome = Outcome(outcome)
        commit_reason = SHUTDOWN_FINISHED if self.shutdown.requested else None
        if self._guarded(
            report,
            lease,
            lambda: self.ledger.commit_result(
                lease, self.step, outcome.payload, outcome.follow_ups, reason=commit_reason
            ),
        ):
            report.completed.append(lease.work_key)

    @staticmethod
    def _guarded(report: WorkerReport, lease: Lease, write: Callable[[], object]) -> bool:
        try:
            write()
        except StaleFenceError:
            report.refused.append(lease.work_key)
            return False
        return True
