"""SheetClaimOperator: claim rows in the sheet first, then create one run per claimed row.

The order is the point. The claim is written to the sheet, the place every future wake-up reads,
before any run exists; each run's id is derived from the row's stable key and the processing
version, so a second attempt to create it (a retry, a second claimer, ``sheet_reconcile``) is
refused by Airflow's metadata database and counted as success. A crash between the two leaves a
claimed row with no run, which ``sheet_reconcile`` repairs; never a run with an unclaimed row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

#: The ``article_pipeline`` DAG each claimed row starts.
ARTICLE_PIPELINE = "article_pipeline"


def create_dag_run(dag_id: str, run_id: str, conf: dict[str, Any], *, reset: bool = False) -> str:
    """Create a DAG run from inside a running task; return ``"created"`` or ``"exists"``.

    This is what ``TriggerDagRunOperator`` does in Airflow 3 (it raises ``DagRunTriggerException``
    and the task runner sends a ``TriggerDagRun`` message to its supervisor, which calls the
    Execution API); sending the message ourselves lets one task create many runs. A run id that
    already exists comes back as ``DAGRUN_ALREADY_EXISTS``, which we treat as success: the run we
    wanted is there.

    :param dag_id: the DAG to run.
    :param run_id: the deterministic run id.
    :param conf: the run's conf.
    :param reset: clear the existing run instead (re-drive a finished run under the same id).
    """
    from airflow.sdk.exceptions import ErrorType
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun

    response = task_runner.SUPERVISOR_COMMS.send(
        TriggerDagRun(dag_id=dag_id, run_id=run_id, conf=conf, logical_date=None, reset_dag_run=reset)
    )
    if isinstance(response, ErrorResponse):
        if response.error == ErrorType.DAGRUN_ALREADY_EXISTS:
            return "exists"
        raise RuntimeError(
            f"could not create run {run_id!r} of {dag_id!r}: {response.error} {response.detail}"
        )
    return "created"


class SheetClaimOperator(BaseOperator):
    """Claim up to ``max_rows`` NEW rows of the queue sheet, then start one run per claimed row.

    Costs one read, one write and one verification read of the sheet whatever ``max_rows`` is
    (two more writes when some rows are INVALID or DUPLICATE). Returns, as XCom, the claims and
    what happened to each run.

    :param max_rows: most rows claimed per execution (templated).
    :param processing_version: part of every run id; bump it to process articles again (templated).
    :param gcp_conn_id: the Sheets connection.
    :param spreadsheet_id: the spreadsheet (default: the connection's ``spreadsheet_id`` extra).
    :param sheet: the queue tab (default: the connection's ``sheet`` extra, else ``queue``).
    :param trigger_dag_id: the DAG started per row.
    """

    template_fields: Sequence[str] = ("max_rows", "processing_version", "spreadsheet_id", "sheet")
    ui_color = "#e8f7e4"

    def __init__(
        self,
        *,
        max_rows: int = 50,
        processing_version: str = "v1",
        gcp_conn_id: str = "onceflow_sheets",
        spreadsheet_id: str | None = None,
        sheet: str | None = None,
        trigger_dag_id: str = ARTICLE_PIPELINE,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("pool", "onceflow_sheets")
        super().__init__(**kwargs)
        self.max_rows = max_rows
        self.processing_version = processing_version
        self.gcp_conn_id = gcp_conn_id
        self.spreadsheet_id = spreadsheet_id
        self.sheet = sheet
        self.trigger_dag_id = trigger_dag_id

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.hooks.sheets import SheetQueueHook

        hook = SheetQueueHook(self.gcp_conn_id, spreadsheet_id=self.spreadsheet_id, sheet=self.sheet)
        queue = hook.queue(str(self.processing_version))
        result = queue.claim(int(self.max_rows))
        for rejection in result.rejected:
            self.log.info(
                "row %d marked %s: %s", rejection.row_number, rejection.status.value, rejection.reason
            )
        runs: dict[str, str] = {}
        failures: list[str] = []
        for claim in result.claims:
            conf = claim.conf(hook.spreadsheet_id, hook.sheet, str(self.processing_version))
            try:
                runs[claim.run_id] = create_dag_run(self.trigger_dag_id, claim.run_id, conf)
            except Exception as err:  # keep going: one refusal must not orphan the other claims
                self.log.exception("could not create run %s", claim.run_id)
                failures.append(f"{claim.run_id}: {err}")
                continue
            self.log.info(
                "row %d (%s): run %s %s", claim.row_number, claim.url, claim.run_id, runs[claim.run_id]
            )
        self.log.info(
            "claimed %d of %d aimed at; %d rejected; sheet calls %s",
            len(result.claims),
            result.aimed,
            len(result.rejected),
            dict(queue.transport.calls),
        )
        if failures:
            # the rows stay claimed; sheet_reconcile creates these runs after the lease
            raise RuntimeError(f"{len(failures)} of {len(result.claims)} runs not created: {failures}")
        return {
            "claims": [
                {"claim_token": c.token, "row_key": c.row_key, "url": c.url, "run_id": c.run_id}
                for c in result.claims
            ],
            "runs": runs,
            "rejected": [
                {"claim_token": r.token, "status": r.status.value, "reason": r.reason}
                for r in result.rejected
            ],
        }
