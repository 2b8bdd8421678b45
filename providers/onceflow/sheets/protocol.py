"""``SheetQueue``: the article queue on one tab, every job of the queue behind one object.

The jobs live in their own modules and call down only, never back up here:

* :mod:`onceflow.sheets.tab`: the tab's reads, the fenced status batch, the request builders;
* :mod:`onceflow.sheets.anchored`: reads and writes through a row's anchor, the anchor sweep;
* :mod:`onceflow.sheets.audit`: the audit tab;
* :mod:`onceflow.sheets.claim`: the claim protocol;
* :mod:`onceflow.sheets.settle`: a row's last writes with its anchor's removal;

and above this module, :mod:`onceflow.sheets.relay` (write-backs from the ledger's outbox),
:mod:`onceflow.sheets.wakeup` (one ``sheet_claim`` wake-up) and :mod:`onceflow.sheets.reconcile`.
``docs/sheet-queue.md`` has the protocol, its argument and its assumptions.
"""

from __future__ import annotations

import random
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from onceflow.sheets import anchored, settle
from onceflow.sheets.a1 import a1_sheet, column_letter
from onceflow.sheets.audit import AUDIT_HEADER, AuditTab
from onceflow.sheets.claim import Claim, Claimer, ClaimResult, Rejection
from onceflow.sheets.model import Status
from onceflow.sheets.tab import QueueTab

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from onceflow.sheets.model import ColumnMap, Row, Snapshot
    from onceflow.sheets.retry import Backoff
    from onceflow.sheets.transport import SheetsTransport

__all__ = ["AUDIT_HEADER", "Claim", "ClaimResult", "Rejection", "SheetQueue", "a1_sheet", "column_letter"]


class SheetQueue(QueueTab):
    """The article queue on one tab of one spreadsheet.

    :param transport: the Sheets API calls (one transport per thread).
    :param sheet: tab title of the queue.
    :param version: processing version, part of every run id and claim token (``ValueError``
        unless it matches ``[A-Za-z0-9_.-]{1,40}``).
    :param audit_sheet: tab title of the audit log.
    :param backoff: retry policy for 429s and failed reads.
    :param clock: returns the current aware time (a fake clock in tests).
    :param spread: pick claim targets at random among the first ``spread * limit`` NEW rows, so
        concurrent claimers rarely aim at the same cells; 1 means strictly first-come.
    :param always_verify: read back after every claim write, even when each claim's URL guard
        confirmed it in place (one more read per wake-up; drops the reliance on the per-request
        ``occurrencesChanged`` replies, see ``docs/sheet-queue.md``).
    """

    def __init__(
        self,
        transport: SheetsTransport,
        *,
        sheet: str = "queue",
        version: str = "v1",
        audit_sheet: str = "audit",
        backoff: Backoff | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        spread: int = 4,
        rng: random.Random | None = None,
        always_verify: bool = False,
    ) -> None:
        super().__init__(
            transport, sheet=sheet, version=version, audit_sheet=audit_sheet, backoff=backoff, clock=clock
        )
        #: the claim protocol (onceflow.sheets.claim)
        self.claimer = Claimer(self, spread=spread, rng=rng, always_verify=always_verify)
        #: reads and writes through row anchors (onceflow.sheets.anchored)
        self.anchored = anchored.AnchoredRows(self)
        #: the audit tab (onceflow.sheets.audit)
        self.audit_tab = AuditTab(self)

    @property
    def rng(self) -> random.Random:
        """The random choice of claim targets."""
        return self.claimer.rng

    # -- the claim (onceflow.sheets.claim) ---------------------------------------------------------

    def claim(self, limit: int, attempts: int = 3) -> ClaimResult:
        """Claim up to ``limit`` NEW rows in one read and one write
        (:meth:`onceflow.sheets.claim.Claimer.claim`); bad NEW rows come back in ``rejected``,
        still PROCESSING, for their verdict to leave through the outbox."""
        return self.claimer.claim(limit, attempts)

    def pick_targets(self, snapshot: Snapshot, limit: int) -> tuple[list[Row], list[Row]]:
        """The rows a claim of ``limit`` would aim at in ``snapshot``: (NEW rows, bad NEW rows)."""
        return self.claimer.pick_targets(snapshot, limit)

    # -- a row's last writes (onceflow.sheets.settle) ----------------------------------------------

    def finish(
        self,
        token: str,
        new: Status,
        fields: dict[str, str] | None = None,
        old: Status | Collection[Status] = Status.PROCESSING,
        *,
        same: Callable[[Row], bool] | None = None,
    ) -> bool:
        """Settle the row of ``token``: write ``fields``, then ``old`` (PROCESSING by default) ->
        ``new`` (final) with its row anchor deleted in the same batch, unless ``same`` refuses the
        row. See :func:`onceflow.sheets.settle.finish_many`."""
        return settle.finish_many(self, [(token, new, fields)], old, same=same)[0]

    def finish_many(self, items: Sequence[settle.Finish]) -> list[bool]:
        """:meth:`finish` for many rows at the cost of one (1 read + 2 writes)."""
        return settle.finish_many(self, items)

    def sweep_anchors(self, released: Collection[str] = ()) -> int:
        """Delete row anchors of rows no longer in flight (:func:`onceflow.sheets.anchored.sweep_anchors`)."""
        return anchored.sweep_anchors(self, released)

    # -- by the row's anchor (onceflow.sheets.anchored) --------------------------------------------

    def anchored_rows(self, tokens: Sequence[str]) -> tuple[ColumnMap | None, dict[str, list[Row]]]:
        """The header and, per token, every row anchored to it: one ``values.batchGetByDataFilter``."""
        return self.anchored.rows(tokens)

    def write_anchored(self, columns: ColumnMap, updates: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
        """Each token's fields into the row its anchor is on: one ``values.batchUpdateByDataFilter``."""
        return self.anchored.write(columns, updates)

    def locate(self, token: str) -> Row | None:
        """The row anchored to ``token`` that carries it (a full read for claims without an anchor)."""
        return self.anchored.locate(token)

    def write_fields(
        self,
        token: str,
        fields: dict[str, str],
        attempts: int = 3,
        check: Callable[[Row], None] | None = None,
    ) -> Row:
        """Write ``fields`` into the row of ``token`` through its anchor, 1 read + 1 write
        (:meth:`onceflow.sheets.anchored.AnchoredRows.write_fields`)."""
        return self.anchored.write_fields(token, fields, attempts=attempts, check=check)

    # -- the audit tab (onceflow.sheets.audit) -----------------------------------------------------

    def audit(self, entries: list[dict[str, str]]) -> None:
        """Append entries (keys from :data:`AUDIT_HEADER`) to the audit tab, creating it if needed."""
        self.audit_tab.append(entries)

    def read_audit(self) -> list[dict[str, str]]:
        """The audit tab as dicts; empty if the tab does not exist yet."""
        return self.audit_tab.read()
