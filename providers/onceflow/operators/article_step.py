"""What every task of an ``article_pipeline`` run shares: its claim, its lane, its ledger step.

:class:`ArticleStepOperator` is the base of ``read_claimed_row`` and of each step of the chain
(:mod:`onceflow.operators.articles`). It

* checks the run's lane (a run sent to the other lane's DAG fails at once, no retry);
* resolves the run's claim: from the conf (``sheet_claim``/``sheet_reconcile`` runs) or, for a
  recheck run, from the ledger item and the run that owns the article;
* runs :meth:`work` as a fenced keyed step on ``article:<row key>`` (:func:`run_keyed_step`) as
  the deployed code's processing version, reusing this run's committed result on a retry
  (``reuse_prefix`` = the run);
* hands the lease back when Airflow stops the task (``on_kill``);
* defers instead of failing when the item requires another processing version, when an earlier
  attempt's lease is still current (a killed try: wait for its expiry, holding no slot), and when
  a server asked to be retried after a given time (``Retry-After``);
* on :class:`~onceflow.ledger.steps.InvalidInput` (the ledger moved the item to
  ``needs_correction``) fails without a retry; a :class:`PermanentStepError` also commits the
  row's FAILED with its reason to the ledger's outbox, in the ``needs_correction`` transaction
  (a try whose lease was taken over commits neither), and relays it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from airflow.sdk import Context

    from onceflow.articles.chain import StepRun
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import FollowUp
    from onceflow.ledger.steps import StepOutcome
    from onceflow.sheets.model import Status
    from onceflow.sheets.protocol import SheetQueue
    from onceflow.sheets.relay import SheetRelayReport
    from onceflow.shutdown import GracefulShutdown


def claimed_queue(conf: dict[str, Any]) -> Any:
    """The queue sheet of the run's claim (spreadsheet, tab and version from the conf)."""
    from onceflow.hooks.sheets import SheetQueueHook

    hook = SheetQueueHook(spreadsheet_id=conf.get("spreadsheet_id"), sheet=conf.get("sheet"))
    return hook.queue(str(conf.get("processing_version", "v1")))


def claim_target(conf: dict[str, Any]) -> str:
    """The outbox target (spreadsheet and tab) of a claim's queue, from its conf: no connection
    lookup (:func:`onceflow.sheets.relay.queue_target` of the queue :func:`claimed_queue` opens)."""
    from onceflow.sheets.relay import sheet_target

    spreadsheet, sheet = conf.get("spreadsheet_id"), conf.get("sheet")
    if not spreadsheet or not sheet:
        from onceflow.sheets.relay import queue_target

        return queue_target(claimed_queue(conf))  # the connection's defaults fill the gaps
    return sheet_target(str(spreadsheet), str(sheet))


def row_status(
    run: StepRun, status: Status, fields: dict[str, str], old: Sequence[Status] | None = None
) -> FollowUp:
    """The ``sheet_row`` follow-up that moves the run's row to ``status`` with ``fields`` (only
    while its URL still names the run's article), for the sheet relay."""
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import row_write

    old = old or (Status.PROCESSING, Status.NEEDS_REVIEW)
    target = claim_target(run.conf)
    return row_write(target, str(run.conf["claim_token"]), status, fields, old=old, row_key=run.row_key)


def relay_claimed_sheet(
    ledger: Ledger, conf: dict[str, Any], queue: SheetQueue | None = None
) -> SheetRelayReport:
    """Relay the pending write-backs of the run's queue sheet, this row's among them (1 read + 2
    writes for all of them, :mod:`onceflow.sheets.relay`).

    :param queue: the claim's queue when the caller has one (else it is opened from ``conf``).
    """
    from onceflow.sheets.relay import queue_target, relay_sheet_rows

    queue = queue if queue is not None else claimed_queue(conf)
    return relay_sheet_rows(ledger, lambda _sid, _tab: queue, target=queue_target(queue))


def run_claim_conf(
    context: Context, ledger: Ledger, lane: str, dag_id: str, claim: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run's conf with its claim (token, row key, URL, sheet), checked against the lane.

    ``claim``, when given, stands in for the run's conf: one run working on many claims (a task
    mapped over a batch of claims) passes each task its own.

    :raises AirflowFailException: wrong lane, or a conf without a claim (a retry cannot help).
    """
    from onceflow.compat import AirflowFailException
    from onceflow.lanes import LANES, WrongLane, check_run_lane
    from onceflow.operators.sheets import run_claim_token
    from onceflow.sheets.ledger_link import owner_claim

    conf = dict(claim) if claim is not None else dict(context["dag_run"].conf or {})
    try:
        check_run_lane(conf, lane, dag_id)
    except WrongLane as exc:
        raise AirflowFailException(str(exc)) from exc  # a retry lands in the same lane
    if not conf.get("claim_token") and conf.get("work_key"):
        # a recheck run: the claim is on the ledger item, its token the one of the article's
        # run (the payload's may be a claimer's that died or stepped aside: a DUPLICATE row)
        chain = dag_id.removesuffix(LANES[lane].dag_suffix)  # the new lane's DAG
        owner = owner_claim(ledger, str(conf["work_key"]), lambda run: run_claim_token(chain, run))
        conf = {**owner, **conf}
    if not conf.get("claim_token") or not conf.get("row_key"):
        raise AirflowFailException(
            "run conf has no claim_token/row_key: article_pipeline runs are created by sheet_claim, "
            f"sheet_reconcile or recheck; got keys {sorted(conf)}"
        )
    return conf


def step_run(context: Context, ledger: Ledger, conf: dict[str, Any]) -> StepRun:
    """This task's view of the article: key, deployed version, and this run's committed results."""
    from onceflow.articles.chain import StepRun
    from onceflow.sheets.ledger_link import work_key
    from onceflow.versions import deployed_version

    ti = context["ti"]
    return StepRun(
        ledger=ledger,
        work_key=work_key(str(conf["row_key"])),
        row_key=str(conf["row_key"]),
        version=deployed_version(),  # the code's version, never the conf's
        conf=conf,
        run_id=str(ti.run_id),
        reuse_prefix=f"{ti.dag_id}/{ti.run_id}/",  # a retry of this run repeats nothing
    )


class ArticleStepOperator(BaseOperator):
    """A fenced keyed step on the article's ledger item (see the module); subclasses set
    :attr:`step` and implement :meth:`work`.

    :param ledger_conn_id: the work ledger.
    :param lease_seconds: the step's lease; heartbeats extend it while the step runs.
    :param version_wait_seconds: how long to defer before looking again when the item requires
        another processing version than this worker runs.
    :param max_waits: deferrals for a held lease or a server's ``Retry-After`` before the error
        goes to Airflow's retry instead (a version wait never gives up).
    :param lane: the lane this task's DAG serves: ``new`` (default) or ``recheck``.
    :param claim: the claim conf to work on instead of the run's conf (templated; a mapped task
        over a batch of claims gets one each, ``.expand(claim=...)``).
    """

    template_fields: Sequence[str] = ("claim",)

    #: The ledger step name the result is committed under.
    step: str = ""
    #: The package extra the step's libraries come from (checked first, so a missing one is named).
    requires_extra: str | None = "articles"
    #: Relay the sheet's pending write-backs once the result is committed (a step whose
    #: follow-ups move the row); a failed pass raises ``TransientStepError`` (Airflow's retry).
    relays: bool = False
    ui_color = "#e8f7e4"

    def __init__(
        self,
        *,
        ledger_conn_id: str = "onceflow_ledger",
        lease_seconds: float = 120.0,
        version_wait_seconds: float = 60.0,
        max_waits: int = 5,
        lane: str = "new",
        claim: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from onceflow.lanes import LANES

        super().__init__(**kwargs)
        if lane not in LANES:
            raise ValueError(f"lane must be one of {sorted(LANES)}, not {lane!r}")
        if not self.step:
            raise TypeError(f"{type(self).__name__} names no ledger step")
        self.ledger_conn_id = ledger_conn_id
        self.lease_seconds = lease_seconds
        self.version_wait_seconds = version_wait_seconds
        self.max_waits = max_waits
        self.lane = lane
        self.claim = claim
        self._shutdown: GracefulShutdown | None = None
        self._memo: dict[Any, Any] = {}

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        """Do the step with the lease in hand (``run.token``); return the payload to commit."""
        raise NotImplementedError

    def follow_ups(self, run: StepRun, result: dict[str, Any], context: Context) -> Sequence[FollowUp]:
        """What must follow ``result``, committed in its ledger transaction (none by default)."""
        return ()

    def invalid_follow_ups(self, run: StepRun, exc: Exception) -> Sequence[FollowUp]:
        """What must follow a permanent failure, committed with the item's ``needs_correction``:
        the row FAILED with the reason, from PROCESSING or (after an approval) NEEDS_REVIEW."""
        from onceflow.articles.errors import PermanentStepError
        from onceflow.articles.writeback import failed_fields
        from onceflow.sheets.model import Status

        if not isinstance(exc, PermanentStepError):
            return ()
        reason = exc.reason if exc.reason.startswith(f"{self.step}") else f"{self.step}: {exc.reason}"
        return [row_status(run, Status.FAILED, failed_fields(reason))]

    def execute(self, context: Context) -> Any:
        return self._execute(context, waits=0)

    def execute_after_wait(self, context: Context, event: Any = None, waits: int = 0) -> Any:
        """Resumed after a deferral for a held lease or a ``Retry-After``: the same step again."""
        return self._execute(context, waits=waits)

    def execute_after_version_wait(self, context: Context, event: Any = None) -> Any:
        """Resumed after :meth:`_wait_for_version`: the same step again, as this worker's version."""
        return self._execute(context, waits=0)

    def on_kill(self) -> None:
        """Airflow is stopping the task (SIGTERM): hand the item's lease back at once."""
        if self._shutdown is not None:
            self._shutdown.request()

    def _execute(self, context: Context, *, waits: int) -> Any:
        from onceflow.articles import chain
        from onceflow.articles.errors import TransientStepError
        from onceflow.compat import AirflowFailException
        from onceflow.ledger import LeaseHeld, WrongVersion
        from onceflow.ledger.steps import InvalidInput

        ledger = self.prepare()
        conf = run_claim_conf(context, ledger, self.lane, self.dag_id, self.claim)
        try:
            _, outcome = self.run_step(context, ledger, conf)
        except InvalidInput as exc:
            self.record_invalid(ledger, conf, exc)
            raise AirflowFailException(str(exc)) from exc  # recorded in the ledger; a retry cannot help
        except WrongVersion as exc:
            self._wait_for_version(exc)
        except LeaseHeld as exc:
            # an earlier try was killed holding the lease: its expiry is when we may take over
            self._wait(exc, self.lease_wait(exc), waits)
        except TransientStepError as exc:
            if exc.retry_after is None:
                raise  # Airflow's retry, with its exponential backoff
            self._wait(exc, float(exc.retry_after), waits)
        chain.checkpoint(f"{self.step}.committed")
        if self.relays:
            report = relay_claimed_sheet(ledger, conf, self.queue_of(conf))
            if report.errors:
                raise TransientStepError(f"write-back relay: {report.errors[0]}", step=self.step)
        if outcome.repeated:
            self.log.info(
                "ledger already holds %s's result (token %s): nothing repeated", self.step, outcome.token
            )
        return dict(outcome.payload)

    def prepare(self) -> Ledger:
        """Check the step's extra, install the stop flag; the ledger to work on."""
        if self.requires_extra:
            from onceflow.extras import require

            require(self.requires_extra)  # the task log names the extra to install, not a bare ImportError
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.shutdown import GracefulShutdown

        self._shutdown = GracefulShutdown()
        return self.cached("ledger", lambda: LedgerHook(self.ledger_conn_id).get_ledger())

    def run_step(
        self, context: Context, ledger: Ledger, conf: dict[str, Any], run: StepRun | None = None
    ) -> tuple[StepRun, StepOutcome]:
        """The step on the article of ``conf`` as one fenced keyed step: its own lease (fencing
        token + 1), its own result and follow-ups, committed together (or the earlier commit of
        this run, returned without working).

        :raises InvalidInput: a permanent failure, recorded (``needs_correction``, the row's FAILED
            in the outbox).
        :raises LeaseHeld: an earlier try's lease is current.
        :raises WrongVersion: the item requires another processing version.
        :raises TransientStepError: and any other error of the work: recorded as a transient
            failure of the item, for Airflow's retry.
        :param run: the article's :func:`step_run` when the caller already made it.
        """
        from onceflow.ledger.steps import run_keyed_step
        from onceflow.sheets.keys import RUN_CONF_KEYS
        from onceflow.sheets.ledger_link import KIND

        run = run if run is not None else step_run(context, ledger, conf)
        ti = context["ti"]

        def work(lease: Any) -> dict[str, Any]:
            run.token = int(lease.token)  # outputs are keyed by it: a retry never overwrites
            return self.work(run, context)

        outcome = run_keyed_step(
            ledger,
            kind=KIND,
            work_key=run.work_key,
            step=self.step,
            owner=f"{ti.dag_id}/{ti.run_id}/{ti.try_number}/{ti.task_id}",
            worker_version=run.version,
            work=work,
            lease_seconds=self.lease_seconds,
            reuse_prefix=run.reuse_prefix,
            payload={k: conf[k] for k in RUN_CONF_KEYS if k in conf},
            shutdown=self._shutdown,
            follow_ups=lambda result: self.follow_ups(run, result, context),
            invalid_follow_ups=lambda exc: self.invalid_follow_ups(run, exc),
        )
        return run, outcome

    def lease_wait(self, exc: Any) -> float:
        """Seconds until the held lease of ``exc`` (a :class:`LeaseHeld`) expires, plus one."""
        left = (exc.expires_at or 0.0) - time.time()
        return min(max(left, 0.0), self.lease_seconds) + 1.0

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """One ``make()`` per task for ``key`` (a hook, a store, a queue): the articles of a batch
        step share them instead of looking up the connection (and building a client) each."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def storage_hook(self) -> Any:
        """The ``onceflow_storage`` hook, one per task."""
        from onceflow.hooks.storage import StorageHook

        return self.cached("storage", StorageHook)

    def step_store(self) -> Any:
        """The step outputs' store (:class:`~onceflow.articles.storage.StepStore`), one per task."""
        return self.cached("store", lambda: self.storage_hook().step_store())

    def queue_of(self, conf: dict[str, Any]) -> SheetQueue:
        """The queue sheet of a claim (:func:`claimed_queue`), one per sheet and version per task."""
        key = (
            "queue",
            conf.get("spreadsheet_id"),
            conf.get("sheet"),
            str(conf.get("processing_version", "v1")),
        )
        return self.cached(key, lambda: claimed_queue(conf))

    def record_invalid(self, ledger: Ledger, conf: dict[str, Any], exc: Exception) -> None:
        """A permanent step failure: relay the row's FAILED (committed to the outbox with the
        item's ``needs_correction``) to the sheet, the editor's place.

        If the relay fails, the row waits in the outbox for the next pass (``sheet_claim``'s);
        the task fails without a retry either way.
        """
        from onceflow.articles.errors import PermanentStepError

        if not isinstance(exc, PermanentStepError):
            return
        token = str(conf["claim_token"])
        try:
            report = relay_claimed_sheet(ledger, conf, self.queue_of(conf))
        except Exception:
            self.log.exception("could not relay the row's FAILED; the next relay pass will")
            return
        if report.errors:
            self.log.warning("FAILED of claim %s not relayed yet: %s", token, report.errors[0])
        elif token in report.left:
            self.log.warning(
                "the row of claim %s was not in flight for its article: FAILED not written", token
            )

    def _wait(self, exc: Exception, seconds: float, waits: int) -> NoReturn:
        """Defer ``seconds`` (holding no slot), then run the step again; past ``max_waits``, raise."""
        from datetime import timedelta

        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        if waits >= self.max_waits:
            raise exc
        self.log.warning("%s; deferring %.0fs, then trying again (wait %d)", exc, seconds, waits + 1)
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=seconds)),
            method_name="execute_after_wait",
            kwargs={"waits": waits + 1},
        )

    def _wait_for_version(self, exc: Any) -> NoReturn:
        """Leave the item for a worker running its version: defer, then look again."""
        from datetime import timedelta

        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        self.log.warning(
            "%s; deferring %ss, then looking again (on whichever worker resumes the task)",
            exc, self.version_wait_seconds,
        )  # fmt: skip
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=float(self.version_wait_seconds))),
            method_name="execute_after_version_wait",
        )
