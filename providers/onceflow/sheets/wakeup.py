"""One wake-up of the sheet queue: write what waits in the outbox, claim, send the claim's verdicts.

What ``sheet_claim``'s ``claim_rows`` task does, as a library call (:func:`wake_up`):

1. **relay**: every write-back of this tab pending in the ledger's outbox (a chain whose own
   relay failed or died, a claim killed between its commit and its relay) is written;
2. **claim** up to ``limit`` NEW rows (:meth:`~onceflow.sheets.protocol.SheetQueue.claim`);
3. the rows the claim took to be **INVALID or DUPLICATE** get their final status and reason the
   way every final status leaves: committed to the outbox (filed under their claim, keyed by
   token and status), then relayed. A process killed between the commit and the relay loses
   nothing (the next wake-up writes them); one killed inside the relay, after its sheet batch,
   repeats nothing (the fenced moves find the rows final, no field is written again). The row's
   anchor goes in the batch of its final transition, as for DONE.

Without a ledger (``ledger=None``) the verdicts are settled at once by the same code, with nothing
durable between the claim and the write (a crash leaves the rows PROCESSING for
``sheet_reconcile``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onceflow.sheets.relay import (
    SheetRelayReport,
    decided_write,
    queue_target,
    relay_sheet_rows,
    send_rows,
)

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import FollowUp
    from onceflow.sheets.protocol import ClaimResult, Rejection, SheetQueue

log = logging.getLogger(__name__)

#: the ledger step the claim's INVALID and DUPLICATE are filed under in the outbox
CLAIM_STEP = "sheet_claim"


@dataclass
class WakeUp:
    """One wake-up: the relay of what waited, the claim, and the relay of the claim's verdicts."""

    claim: ClaimResult
    relayed: SheetRelayReport = field(default_factory=SheetRelayReport)
    rejected: SheetRelayReport = field(default_factory=SheetRelayReport)
    #: every Sheets request of the wake-up, per API method
    requests: Counter[str] = field(default_factory=Counter)


def rejection_writes(queue: SheetQueue, rejected: list[Rejection]) -> list[FollowUp]:
    """The outbox writes of the rows a claim took to be INVALID or DUPLICATE: from PROCESSING, and
    only while the row still holds the URL judged (an INVALID one: the same text; a DUPLICATE: the
    same article), so a URL the editor fixed meanwhile is not marked."""
    target = queue_target(queue)
    return [
        decided_write(
            target, r.token, r.status, r.reason, url=None if r.row_key else r.url, row_key=r.row_key
        )
        for r in rejected
    ]


def wake_up(queue: SheetQueue, ledger: Ledger | None, limit: int) -> WakeUp:
    """Relay the tab's pending writes, claim up to ``limit`` NEW rows, send the INVALID and
    DUPLICATE rows through the outbox (see the module docstring).

    A relay that fails (5xx, quota) is logged and leaves its rows pending: claiming goes on.
    """
    before = Counter(queue.transport.calls)
    relayed = SheetRelayReport()
    if ledger is not None:
        relayed = relay_sheet_rows(ledger, lambda _sid, _tab: queue, target=queue_target(queue))
        if relayed.errors:
            log.warning("write-backs left pending for the next wake-up: %s", relayed.errors)
    result = queue.claim(limit)
    rejected = send_rows(queue, ledger, CLAIM_STEP, rejection_writes(queue, result.rejected))
    if rejected.errors:
        log.warning("INVALID/DUPLICATE rows left for the next wake-up: %s", rejected.errors)
    return WakeUp(result, relayed, rejected, Counter(queue.transport.calls) - before)
