"""One wake-up of the sheet queue: write what waits in the outbox, claim, send the claim's verdicts.

What ``sheet_claim``'s ``claim_rows`` task does, as a library call (:func:`wake_up`):

1. **relay** every write-back of this tab pending in the ledger's outbox (a chain whose own
   relay failed or died, a claim killed between its commit and its relay) and **claim** up to
   ``limit`` NEW rows (:meth:`~onceflow.sheets.claim.Claimer.claim`) **together**: the claim's
   read (a ``spreadsheets.get`` bringing the tab id, the values and every row's anchors) is the
   relay's read too, the relay writes its fields through the anchors, and its fenced moves, URL
   guards and anchor deletions ride first in the claim's ``batchUpdate``
   (:class:`~onceflow.sheets.relay.RowWrites`). So a wake-up that claims K rows and relays K
   write-backs costs **1 read + 2 writes**, where the claim alone costs 1 + 1 and a relay pass
   alone 1 + 2. When no claim batch goes out (nothing NEW), the relay sends its own batch, from
   the claim's read;
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
    DEFAULT_LIMIT,
    RowWrites,
    SheetRelayReport,
    decided_write,
    queue_target,
    record,
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


def wake_up(
    queue: SheetQueue, ledger: Ledger | None, limit: int, *, relay_limit: int = DEFAULT_LIMIT
) -> WakeUp:
    """Relay the tab's pending writes and claim up to ``limit`` NEW rows, sharing one read and one
    ``batchUpdate`` (:func:`claim_and_relay`); then send the INVALID and DUPLICATE rows through the
    outbox (see the module docstring).
    """
    before = Counter(queue.transport.calls)
    result, relayed = claim_and_relay(queue, ledger, limit, relay_limit=relay_limit)
    rejected = send_rows(queue, ledger, CLAIM_STEP, rejection_writes(queue, result.rejected))
    if rejected.errors:
        log.warning("INVALID/DUPLICATE rows left for the next wake-up: %s", rejected.errors)
    return WakeUp(result, relayed, rejected, Counter(queue.transport.calls) - before)


def claim_and_relay(
    queue: SheetQueue, ledger: Ledger | None, limit: int, *, relay_limit: int = DEFAULT_LIMIT
) -> tuple[ClaimResult, SheetRelayReport]:
    """The tab's write-backs pending in the outbox (``relay_limit`` at most) ride in the claim:
    planned from its read, their fields written before its batch, their moves first in it (alone,
    from the same read, when no claim batch goes out). A relay that fails (5xx, quota) is logged and
    leaves its rows pending: claiming goes on; a claim that raises has its relay recorded first.
    """
    from onceflow.ledger import outbox

    relayed = SheetRelayReport()
    target = queue_target(queue)
    pending = outbox.pending_sheet_rows(ledger, target, relay_limit) if ledger is not None else []
    ride = RowWrites(queue, [row.data for row in pending]) if pending else None
    try:
        result = queue.claimer.claim(limit, ride=ride)
    finally:
        if ride is not None:
            assert ledger is not None
            record(ledger, target, pending, ride.outcome, relayed)
            if relayed.errors:
                log.warning("write-backs left pending for the next wake-up: %s", relayed.errors)
    return result, relayed
