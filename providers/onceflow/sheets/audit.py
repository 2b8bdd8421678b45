"""The audit tab: every repair ``sheet_reconcile`` makes, appended where the editor looks.

``values.append`` inserts after the last row server-side, so appending needs no position. The tab
is created on first use (an ``addSheet`` that two reconcilers may race: the loser's 400, or an
ambiguous 5xx, means it exists) and read back by column position, not by its first row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from onceflow.sheets.a1 import a1_sheet

if TYPE_CHECKING:
    from onceflow.sheets.tab import QueueTab

log = logging.getLogger(__name__)

AUDIT_HEADER = ["time", "action", "reason", "row_key", "url", "claim_token", "run_id"]


class AuditTab:
    """The audit tab beside one queue tab (``queue.audit_sheet``).

    :param queue: the :class:`~onceflow.sheets.tab.QueueTab` whose transport and backoff it uses.
    """

    def __init__(self, queue: QueueTab) -> None:
        self.queue = queue

    def append(self, entries: list[dict[str, str]]) -> None:
        """Append entries (keys from :data:`AUDIT_HEADER`) to the audit tab, creating it if needed.

        ``values.append`` inserts after the last row server-side, so it needs no position.
        """
        if not entries:
            return
        self._ensure_tab()
        rows = [[str(e.get(k, "")) for k in AUDIT_HEADER] for e in entries]

        def attempt() -> None:
            self.queue.transport.append_values(a1_sheet(self.queue.audit_sheet), rows)

        self.queue.backoff.call(attempt)

    def _ensure_tab(self) -> None:
        try:
            self.queue.sheet_id(self.queue.audit_sheet)
            return
        except KeyError:
            pass
        try:
            self.queue.backoff.call(
                lambda: self.queue.transport.batch_update(
                    [{"addSheet": {"properties": {"title": self.queue.audit_sheet}}}]
                )
            )
        except Exception as err:  # another process added it first (400), or an ambiguous 5xx
            log.info("audit tab %r not added (%s); assuming it exists", self.queue.audit_sheet, err)
            self.queue.forget_sheet_ids()
            return
        self.queue.forget_sheet_ids()
        self.queue.backoff.call(
            lambda: self.queue.transport.append_values(a1_sheet(self.queue.audit_sheet), [AUDIT_HEADER])
        )

    def read(self) -> list[dict[str, str]]:
        """The audit tab as dicts (keys from :data:`AUDIT_HEADER`); empty if the tab does not exist yet.

        Columns are taken by position in :data:`AUDIT_HEADER`, the order :meth:`append` writes, and
        a row equal to the header is skipped wherever it is: the header can be missing (an
        ``addSheet`` that failed ambiguously after being applied, a task killed before the header
        append) or below entries (the loser of the ``addSheet`` race appended first), and reading
        row 1 as the header would mis-key every entry (and count no re-drives).
        """
        try:
            self.queue.sheet_id(self.queue.audit_sheet)
        except KeyError:
            return []
        values = self.queue.read([a1_sheet(self.queue.audit_sheet)])[0]
        entries = []
        for raw in values:
            cells = [str(c) for c in raw]
            if not any(c.strip() for c in cells) or cells[: len(AUDIT_HEADER)] == AUDIT_HEADER:
                continue
            entries.append({h: (cells[i] if i < len(cells) else "") for i, h in enumerate(AUDIT_HEADER)})
        return entries
