"""How an article step says that it failed, and whether trying again can help.

A :class:`PermanentStepError` is an :class:`~onceflow.ledger.steps.InvalidInput`: the ledger moves
the item to ``needs_correction`` with the reason, the row gets the reason, and the Airflow task
fails without a retry (a 404 stays a 404). A :class:`TransientStepError` is retried by Airflow
with backoff; ``retry_after`` carries a server's ``Retry-After`` when it sent one.
"""

from __future__ import annotations

from onceflow.ledger.steps import InvalidInput


class PermanentStepError(InvalidInput):
    """The step cannot succeed for this article; ``reason`` is written to the row as is.

    :param reason: one line a sheet editor understands ("blocked: 10.0.0.5 is a private address").
    :param step: the step that failed (``fetch``, ``extract``, ...).
    """

    def __init__(self, reason: str, *, step: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step


class TransientStepError(RuntimeError):
    """The step may succeed later (a timeout, a 5xx, a 429); Airflow's retry owns the timing.

    :param retry_after: seconds the server asked us to wait (``Retry-After``), when it said.
    """

    def __init__(self, reason: str, *, step: str = "", retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step
        self.retry_after = retry_after
