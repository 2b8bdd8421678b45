"""NewRowsSensor: wait for NEW rows in the queue sheet without holding a slot."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from onceflow.triggers.sheets import NewRowsTrigger, count_new_rows, count_pending_writes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context


#: Seconds after the trigger's own timeout at which Airflow's deferral timeout cancels it.
BACKSTOP_SECONDS = 120


class QueueUnreadable(Exception):
    """The queue sheet cannot be read as a queue (a missing column, tab or permission).

    Deliberately not an ``AirflowException``: ``soft_fail`` (which ``sheet_claim`` uses to skip
    a run that found nothing new) turns those into a skip, and a broken sheet must fail loudly.
    """


class NewRowsSensor(BaseSensorOperator):
    """Succeed once the queue tab has at least ``min_rows`` NEW rows, or (with ``ledger_conn_id``)
    write-backs of the tab wait in the ledger's outbox: the claim task that follows relays them.

    Deferrable by default: the task defers at once to :class:`~onceflow.triggers.sheets.NewRowsTrigger`
    and the polling happens in the triggerer, so twenty waiting sensors occupy no worker and no
    pool slot. With ``deferrable=False`` it pokes like any sensor (``mode="reschedule"`` advised).

    :param min_rows: succeed when at least this many rows are NEW.
    :param gcp_conn_id: the Sheets connection.
    :param spreadsheet_id: the spreadsheet (default: the connection's extra).
    :param sheet: the queue tab (default: the connection's extra, else ``queue``).
    :param deferrable: wait in the triggerer (default True).
    :param ledger_conn_id: the work ledger asked first for waiting write-backs (one query, no
        Sheets request); ``None``: NEW rows only.
    """

    template_fields: Sequence[str] = ("spreadsheet_id", "sheet", "min_rows")

    def __init__(
        self,
        *,
        min_rows: int = 1,
        gcp_conn_id: str = "onceflow_sheets",
        spreadsheet_id: str | None = None,
        sheet: str | None = None,
        deferrable: bool = True,
        ledger_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 60)
        super().__init__(**kwargs)
        self.min_rows = min_rows
        self.gcp_conn_id = gcp_conn_id
        self.spreadsheet_id = spreadsheet_id
        self.sheet = sheet
        self.deferrable = deferrable
        self.ledger_conn_id = ledger_conn_id

    def poke(self, context: Context) -> bool:
        if self.ledger_conn_id:
            waiting = count_pending_writes(
                self.ledger_conn_id, self.gcp_conn_id, self.spreadsheet_id, self.sheet
            )
            if waiting:
                self.log.info("%d write-back(s) wait in the outbox", waiting)
                return True
        found = count_new_rows(self.gcp_conn_id, self.spreadsheet_id, self.sheet)
        self.log.info("%d NEW rows (waiting for %d)", found, self.min_rows)
        return found >= int(self.min_rows)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # The trigger ends the wait itself at the timeout (a quiet queue is no error); Airflow's
        # deferral timeout stays as a backstop a little later, for a triggerer that never ran it.
        timeout = float(self.timeout) if self.timeout else None
        timeout_at = (
            (datetime.now(timezone.utc) + timedelta(seconds=timeout)).isoformat() if timeout else None
        )
        self.defer(
            trigger=NewRowsTrigger(
                gcp_conn_id=self.gcp_conn_id,
                spreadsheet_id=self.spreadsheet_id,
                sheet=self.sheet,
                min_rows=int(self.min_rows),
                poll_interval=float(self.poke_interval),
                timeout_at=timeout_at,
                ledger_conn_id=self.ledger_conn_id,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout + BACKSTOP_SECONDS) if timeout else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> int:
        """Resume after the trigger fired; the XCom is the number of NEW rows seen (0 when it fired
        for write-backs waiting in the outbox).

        :raises QueueUnreadable: the trigger stopped because waiting could not help.
        :raises AirflowSensorTimeout: nothing new before the timeout (a skip with ``soft_fail``).
        """
        if event.get("status") == "timeout":
            from airflow.sdk.exceptions import AirflowSensorTimeout

            raise AirflowSensorTimeout(f"no {self.min_rows} NEW rows before {event.get('timeout_at')}")
        if event.get("status") == "error":
            raise QueueUnreadable(f"the queue sheet cannot be waited on: {event.get('message')}")
        if event.get("pending_writes"):
            self.log.info("trigger saw %s write-back(s) waiting in the outbox", event["pending_writes"])
        else:
            self.log.info("trigger saw %s NEW rows", event.get("new_rows"))
        return int(event.get("new_rows", 0))
