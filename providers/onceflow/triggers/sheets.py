"""NewRowsTrigger: wait in the triggerer until the queue sheet has NEW rows, or write-backs waiting.

Runs in the triggerer's event loop, so a waiting sensor holds no worker slot and no pool slot.
Each poll first asks the work ledger (one query, no Sheets request) whether write-backs of this
tab wait in its outbox, and fires at once when they do: ``sheet_claim``'s wake-up relays them. Else
it reads the queue tab (one ``values.batchGet``) for NEW rows. Both in a thread (the Google
client and SQLAlchemy are synchronous) so the event loop keeps serving other triggers.

The trigger ends its own wait at ``timeout_at`` with a ``timeout`` event. Left to Airflow's
deferral timeout, the triggerer cancels it and logs ``ERROR - Trigger cancelled due to timeout``
on every idle check, an error line for what is the normal outcome of a quiet queue.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def is_permanent(err: BaseException) -> bool:
    """Whether waiting longer cannot fix ``err``: a required column missing, a tab that does not
    exist (400), no access or no such spreadsheet (401/403/404). 429s, 5xx and network errors
    are not: the trigger keeps polling through those."""
    from googleapiclient.errors import HttpError

    from onceflow.sheets.model import MissingColumnsError
    from onceflow.sheets.retry import Refused

    if isinstance(err, (MissingColumnsError, Refused)):
        return True
    return isinstance(err, HttpError) and int(err.resp.status) in (401, 403, 404)


def count_new_rows(gcp_conn_id: str, spreadsheet_id: str | None, sheet: str | None) -> int:
    """Number of rows whose status is NEW (after trimming and upper-casing). One read."""
    from onceflow.hooks.sheets import SheetQueueHook
    from onceflow.sheets.model import Status

    hook = SheetQueueHook(gcp_conn_id, spreadsheet_id=spreadsheet_id, sheet=sheet)
    return sum(1 for row in hook.queue().snapshot().rows if row.status is Status.NEW)


def count_pending_writes(
    ledger_conn_id: str, gcp_conn_id: str, spreadsheet_id: str | None, sheet: str | None
) -> int:
    """Row writes of this tab waiting in the ledger's outbox. One database query, no Sheets request."""
    from onceflow.hooks.ledger import LedgerHook
    from onceflow.hooks.sheets import SheetQueueHook
    from onceflow.ledger.outbox import count_pending_sheet_rows
    from onceflow.sheets.relay import sheet_target

    hook = SheetQueueHook(gcp_conn_id, spreadsheet_id=spreadsheet_id, sheet=sheet)
    engine = LedgerHook(ledger_conn_id).engine
    try:
        return count_pending_sheet_rows(engine, sheet_target(hook.spreadsheet_id, hook.sheet))
    finally:
        engine.dispose()


class NewRowsTrigger(BaseTrigger):
    """Fire once the queue has at least ``min_rows`` NEW rows, or (with ``ledger_conn_id``) any
    write-back of the tab waits in the ledger's outbox.

    :param gcp_conn_id: the Sheets connection.
    :param spreadsheet_id: the spreadsheet (default: the connection's extra).
    :param sheet: the queue tab (default: the connection's extra, else ``queue``).
    :param min_rows: fire when at least this many rows are NEW.
    :param poll_interval: seconds between reads (each read is one request of the read quota).
    :param timeout_at: ISO-8601 instant at which to stop waiting with a ``timeout`` event
        (``None``: wait until the rows come).
    :param ledger_conn_id: the work ledger whose outbox is asked first (``None``: NEW rows only).
    """

    def __init__(
        self,
        *,
        gcp_conn_id: str = "onceflow_sheets",
        spreadsheet_id: str | None = None,
        sheet: str | None = None,
        min_rows: int = 1,
        poll_interval: float = 60.0,
        timeout_at: str | None = None,
        ledger_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self.timeout_at = timeout_at
        self.ledger_conn_id = ledger_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.spreadsheet_id = spreadsheet_id
        self.sheet = sheet
        self.min_rows = min_rows
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "gcp_conn_id": self.gcp_conn_id,
                "spreadsheet_id": self.spreadsheet_id,
                "sheet": self.sheet,
                "min_rows": self.min_rows,
                "poll_interval": self.poll_interval,
                "timeout_at": self.timeout_at,
                "ledger_conn_id": self.ledger_conn_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        end = dt.datetime.fromisoformat(self.timeout_at) if self.timeout_at else None
        while True:
            # The answer at the deadline must come from a look that began at or after it: a look
            # that began before and ended after (a slow read) could miss a row added meanwhile.
            looked_at = dt.datetime.now(dt.timezone.utc)
            waiting = await self._pending_writes()
            if waiting:
                self.log.info("%d write-back(s) wait in the outbox: the wake-up relays them", waiting)
                yield TriggerEvent({"status": "found", "new_rows": 0, "pending_writes": waiting})
                return
            try:
                found = await asyncio.to_thread(
                    count_new_rows, self.gcp_conn_id, self.spreadsheet_id, self.sheet
                )
            except Exception as err:
                if is_permanent(err):
                    # waiting cannot add a column or grant access: end the wait now, saying why
                    yield TriggerEvent({"status": "error", "message": f"{type(err).__name__}: {err}"})
                    return
                # a flaky read is not a reason to stop waiting
                self.log.warning("reading the queue failed (%s); retrying in %ss", err, self.poll_interval)
            else:
                self.log.info("%d NEW rows (waiting for %d)", found, self.min_rows)
                if found >= self.min_rows:
                    yield TriggerEvent({"status": "found", "new_rows": found})
                    return
            delay = self.poll_interval
            if end is not None:
                if looked_at >= end:
                    self.log.info("no %d NEW rows by %s: the wait ends", self.min_rows, self.timeout_at)
                    yield TriggerEvent({"status": "timeout", "timeout_at": self.timeout_at})
                    return
                # Past the deadline already (a slow look): look once more at once.
                delay = min(delay, max(0.0, (end - dt.datetime.now(dt.timezone.utc)).total_seconds()))
            await asyncio.sleep(delay)

    async def _pending_writes(self) -> int:
        """Write-backs of the tab waiting in the outbox; 0 without a ledger or when it cannot be
        asked (logged: the wait goes on, on NEW rows alone)."""
        if not self.ledger_conn_id:
            return 0
        try:
            return await asyncio.to_thread(
                count_pending_writes, self.ledger_conn_id, self.gcp_conn_id, self.spreadsheet_id, self.sheet
            )
        except Exception as err:
            self.log.warning("could not ask the ledger for waiting write-backs (%s)", err)
            return 0
