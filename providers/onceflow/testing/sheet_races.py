"""Race several :class:`~onceflow.sheets.protocol.SheetQueue` claimers over one sheet.

Exactly-once tests all need the same loop (claim until a read shows nothing to aim at) run by
several threads released together; a claimer's exception or a hung thread must fail the test
instead of vanishing with the thread::

    queues = [SheetQueue(GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)) for _ in range(8)]
    results = run_claimers(queues, limit=40)
    claims = [c for per_claimer in results for r in per_claimer for c in r.claims]
    assert len({c.row_key for c in claims}) == len(claims)

``drain`` takes no thread, so a claimer in another process can use it too
(``python -c "from onceflow.testing.sheet_races import drain; ..."``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from onceflow.sheets.protocol import ClaimResult, SheetQueue


def drain(queue: SheetQueue, limit: int, finish: bool = False) -> list[ClaimResult]:
    """Claim up to ``limit`` rows at a time until a read finds no NEW row to aim at.

    Stops on ``aimed == 0`` rather than on an empty claim list: a round can lose every row it
    aimed at to other claimers while NEW rows remain.

    :param finish: after each round, do what ``article_pipeline`` does at its end for every row
        won: write a ``published_url`` and move the row to DONE (with its row anchor removed), in
        one :meth:`~onceflow.sheets.protocol.SheetQueue.finish_many`. Rows in flight then stay
        few, as they do in production, which Google's developer metadata cap needs.
    :return: every ``ClaimResult``, in order (the last one aimed at nothing).
    """
    from onceflow.sheets.model import Status

    results: list[ClaimResult] = []
    while True:
        result = queue.claim(limit)
        results.append(result)
        if finish and result.claims:
            queue.finish_many(
                [(c.token, Status.DONE, {"published_url": published_url(c.url)}) for c in result.claims]
            )
        if result.aimed == 0:
            return results


def published_url(url: str) -> str:
    """The link :func:`drain` writes for a finished row."""
    return "https://published.example.org/" + url.split("://", 1)[-1]


class ClaimerError(RuntimeError):
    """A claimer thread raised, or did not finish in time; ``errors`` holds what each raised."""

    def __init__(self, message: str, errors: Sequence[BaseException] = ()) -> None:
        super().__init__(message)
        self.errors = list(errors)


def run_claimers(
    queues: Sequence[SheetQueue], limit: int, timeout: float = 300, finish: bool = False
) -> list[list[ClaimResult]]:
    """:func:`drain` every queue in its own thread, all released at once by a barrier.

    Build the queues first (one client per queue: a google-api-python-client service is not
    thread-safe) so that setup is not part of the race.

    :param queues: one per claimer.
    :param limit: rows per ``claim`` call.
    :param timeout: seconds for the whole race; threads still running then make it fail.
    :param finish: each claimer finishes the rows it won (see :func:`drain`).
    :return: per claimer, in the order of ``queues``, the ``ClaimResult`` s it got, in order.
    :raises ClaimerError: if any claimer raised (the first error is the cause) or timed out.
    """
    results: list[list[ClaimResult]] = [[] for _ in queues]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(queues), timeout=timeout)

    def claimer(i: int) -> None:
        try:
            barrier.wait()
            results[i] = drain(queues[i], limit, finish=finish)
        except BaseException as err:  # reported by the caller's thread below
            errors.append(err)

    # daemon: a claimer stuck in a request must not keep the test process alive after the failure
    threads = [threading.Thread(target=claimer, args=(i,), daemon=True) for i in range(len(queues))]
    deadline = time.monotonic() + timeout
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    running = sum(t.is_alive() for t in threads)
    if errors or running:
        late = f", {running} still running after {timeout} s" if running else ""
        raise ClaimerError(f"{len(errors)} of {len(queues)} claimers raised{late}: {errors!r}", errors) from (
            errors[0] if errors else None
        )
    return results


__all__ = ["ClaimerError", "drain", "run_claimers"]
