"""The batch lane: one task instance carries one step of the article chain for a batch of articles.

An ``article_batch`` run (``sheet_claim`` with ``batch_size`` of 2 or more creates them) carries up
to N claims in its conf (``claims``: the confs ``sheet_claim`` would give N ``article_pipeline``
runs). Each task of the run is one step of the chain, and each step is the per-article step of
:mod:`onceflow.operators.articles` run once per article, in one task process:

* **Each article is still its own fenced keyed step** (:meth:`ArticleStepOperator.run_step`, that
  is :func:`onceflow.ledger.steps.run_keyed_step` on ``article:<row key>``): its own lease with
  its own fencing token, its own committed result, its own outbox rows. A retry of the task
  returns what this run already committed (``reuse_prefix`` = the run) and works on the rest.
* **Which articles a step carries** is read from the ledger, never from XCom: the batch's claims
  whose previous step this run committed (``after``) and which the step admits (a score under
  the threshold for ``polish``, at or above it for ``publish``...), minus those whose item a
  permanent failure sent back for correction (or the ledger gave up). A step that no article
  will reach is skipped by the step before it (``skip_if_none``), so it costs no task process.
* **A failure of one never fails the others.** A permanent failure (``PermanentStepError``)
  commits that article's ``needs_correction`` and its row's FAILED through the outbox, as in the
  per-article chain; the article leaves the batch and the step goes on. One relay pass after the
  step writes the FAILED rows (and, for a step that moves rows, its own). A transient failure
  leaves the article for the task's retry: the step finishes the others, then raises; the retry
  works only on what is left. On the last try, what is still left is dropped and the task
  succeeds for the rest (when anything of the step was committed): those rows stay PROCESSING
  and ``sheet_reconcile`` re-drives each alone in ``article_pipeline`` once past the lease,
  exactly as it does a failed per-article run. A lease still held by a killed try (SIGKILL) or a
  server's ``Retry-After`` makes the task defer, holding no slot, until the latest of them, then
  run the step again for what is left.
* **The review stays per article**: the articles still under the threshold after ``polish``
  are marked NEEDS_REVIEW (a batch step, which returns their claims) and a mapped task group gives each its own human-in-the-loop review, publish and write-back.

The step operators here are the per-article ones with :class:`BatchStep` in front: the same
``work``, ``follow_ups`` and pools, and their hooks, stores and queues are made once per task
(:meth:`ArticleStepOperator.cached`), so the connection lookups, the Sheets client and the language
detector are paid once per batch instead of once per article.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from onceflow.compat import SkipMixin
from onceflow.operators.article_step import ArticleStepOperator, relay_claimed_sheet, run_claim_conf, step_run
from onceflow.operators.articles import (
    THRESHOLD_TEMPLATE,
    ExtractArticleOperator,
    FetchArticleOperator,
    MarkNeedsReviewOperator,
    PolishArticleOperator,
    PublishArticleOperator,
    ScoreArticleOperator,
    TranslateArticleOperator,
    WriteBackOperator,
)
from onceflow.operators.sheets import ClaimedRowOperator

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from onceflow.articles.chain import StepRun
    from onceflow.ledger.core import Ledger

#: The run conf key of a batch run's claims.
CLAIMS_KEY = "claims"


@dataclass
class BatchReport:
    """What one execution of a batch step did, article by article (keyed by claim token)."""

    committed: list[dict[str, Any]] = field(default_factory=list)
    repeated: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    failed_confs: list[dict[str, Any]] = field(default_factory=list)
    #: transient failures: for the task's retry
    left: dict[str, str] = field(default_factory=dict)
    #: held leases, ``Retry-After``s, another processing version: seconds to defer for
    waits: dict[str, float] = field(default_factory=dict)
    #: claims not carried (an earlier step did not commit them, or the step does not admit them)
    passed_over: int = 0
    #: the articles of a step run side by side (``concurrency``) report under it
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def summary(self) -> dict[str, Any]:
        """The task's XCom: counts and the tokens of each outcome."""
        return {
            "committed": [str(c["claim_token"]) for c in self.committed],
            "repeated": self.repeated,
            "failed": dict(self.failed),
            "left": dict(self.left),
            "passed_over": self.passed_over,
        }


def score_of(run: StepRun, step: str) -> float | None:
    """The score ``step`` (``score`` or ``polish``) committed in this run, or ``None``."""
    found = run.result(step, required=False)
    return float(found["value"]) if found else None


def final_score(run: StepRun) -> float | None:
    """The score that decides publication: polish's when it ran in this run, else score's."""
    polished = score_of(run, "polish")
    return polished if polished is not None else score_of(run, "score")


class BatchStep(ArticleStepOperator, SkipMixin):
    """Run the step of the per-article operator after it in the MRO for every article of the batch
    (see the module); ``class FetchBatchOperator(BatchStep, FetchArticleOperator)``.

    :param claims: the claim confs to carry (templated); default: the run conf's ``claims``.
    :param threshold: the publication threshold (templated) for the steps that choose by score.
    :param skip_if_none: downstream task ids (batch steps) to skip when, after this step, no
        article would reach them.
    :param concurrency: articles worked on side by side, each in its own thread (default: the
        step's ``default_concurrency``, 1; ``translate``'s 2, since each chunk is an Apertium
        process and the work runs outside Python).
    """

    template_fields: Sequence[str] = ("claims", "threshold")
    #: The step whose result, committed by this run, admits an article (``None``: every claim).
    after: ClassVar[str | None] = None
    #: Return the committed articles' claims (what a mapped review expands over: Airflow maps only
    #: over a return value) instead of the summary of outcomes.
    returns_claims: ClassVar[bool] = False
    #: Articles worked on side by side when ``concurrency`` is not given.
    default_concurrency: ClassVar[int] = 1
    ui_color = "#cfe8c6"

    def __init__(
        self,
        *,
        claims: list[dict[str, Any]] | None = None,
        threshold: float | str = THRESHOLD_TEMPLATE,
        skip_if_none: Sequence[str] = (),
        concurrency: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.claims = claims
        self.threshold = threshold
        self.skip_if_none = list(skip_if_none)
        self.concurrency = int(concurrency or self.default_concurrency)
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")

    def cached(self, key: Any, make: Any) -> Any:
        """:meth:`ArticleStepOperator.cached`, made once even when articles run side by side (the
        lock is made by the first call, :meth:`prepare`'s, before any thread starts; not in
        ``__init__``: Airflow copies operators, and a lock cannot be copied)."""
        lock = self.__dict__.setdefault("_memo_lock", threading.RLock())
        with lock:
            return super().cached(key, make)

    def admits(self, run: StepRun, threshold: float) -> bool:
        """Whether this step carries an article that passed ``after`` (score rules override)."""
        return True

    def before_batch(self, context: Context, runs: list[StepRun]) -> None:
        """Work the articles of ``runs`` (those this run has not committed the step for) share,
        done once before their keyed steps (none by default)."""

    # -- who is in the step ----------------------------------------------------------------------
    def batch_claims(self, context: Context) -> list[dict[str, Any]]:
        """The batch's claim confs: ``claims=``, else the run conf's ``claims``."""
        from onceflow.compat import AirflowFailException

        claims = self.claims if self.claims is not None else (context["dag_run"].conf or {}).get(CLAIMS_KEY)
        if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
            raise AirflowFailException(
                f"a batch run's conf carries its claims as a list under {CLAIMS_KEY!r} (sheet_claim "
                f"with batch_size >= 2 creates such runs); got {type(claims).__name__}"
            )
        return claims

    def members(
        self, context: Context, ledger: Ledger, claims: list[dict[str, Any]], threshold: float
    ) -> tuple[list[StepRun], int]:
        """The articles this step carries, each as its :class:`StepRun`, and how many it passes
        over (see the module)."""
        from onceflow.ledger import states
        from onceflow.ledger.errors import UnknownWorkItem

        runs: list[StepRun] = []
        passed = 0
        for claim in claims:
            conf = run_claim_conf(context, ledger, self.lane, self.dag_id, claim)
            run = step_run(context, ledger, conf)
            try:
                state = ledger.item(run.work_key).state
            except UnknownWorkItem:
                state = None
            # sent back for correction (a permanent failure) or given up: out of the batch for good
            out = state in (states.NEEDS_CORRECTION, states.FAILED)
            before = self.after is None or bool(run.result(self.after, required=False))
            if out or not before or not self.admits(run, threshold):
                passed += 1
                continue
            runs.append(run)
        return runs, passed

    # -- the step --------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        return self._execute_batch(context, waits=0)

    def execute_after_wait(self, context: Context, event: Any = None, waits: int = 0) -> Any:
        """Resumed after a deferral (held leases, ``Retry-After``): the step again for what is left."""
        return self._execute_batch(context, waits=waits)

    def execute_after_version_wait(self, context: Context, event: Any = None) -> Any:
        return self._execute_batch(context, waits=0)

    def _execute_batch(self, context: Context, *, waits: int) -> Any:
        ledger = self.prepare()
        threshold = float(self.threshold)
        claims = self.batch_claims(context)
        runs, passed = self.members(context, ledger, claims, threshold)
        report = BatchReport(passed_over=passed)
        self.log.info("%s for %d of the batch's %d articles", self.step, len(runs), len(claims))
        self.before_batch(context, [r for r in runs if not r.result(self.step, required=False)])
        if self.concurrency > 1 and len(runs) > 1:
            workers = min(self.concurrency, len(runs))
            with ThreadPoolExecutor(workers, thread_name_prefix=f"onceflow {self.step}") as pool:
                # list(): the first AirflowFailException or stop raises here, after the others end
                list(pool.map(lambda run: self._carry(context, ledger, run, report), runs))
        else:
            for run in runs:
                self._carry(context, ledger, run, report)
        order = {str(c.get("claim_token")): i for i, c in enumerate(claims)}
        report.committed.sort(key=lambda c: order.get(str(c["claim_token"]), len(order)))
        self._relay(ledger, report)
        self.log.info(
            "%s: %d committed (%d earlier), %d failed, %d left, %d waiting, %d passed over",
            self.step, len(report.committed), report.repeated, len(report.failed), len(report.left),
            len(report.waits), report.passed_over,
        )  # fmt: skip
        if self._shutdown is not None and self._shutdown.requested:
            from onceflow.ledger.worker import ShutdownRequested

            raise ShutdownRequested(f"stopped during {self.step}; nothing half done is committed")
        if report.waits:
            self._wait_batch(report, waits)
        if report.left:
            self._retry_or_drop(context, report)
        self._skip_unreached(context, ledger, claims, threshold)
        return report.committed if self.returns_claims else report.summary()

    def _carry(self, context: Context, ledger: Ledger, run: StepRun, report: BatchReport) -> None:
        """The step on one article, its outcome put in ``report``."""
        from onceflow.articles import chain

        if self._shutdown is not None and self._shutdown.requested:
            return  # the rest is for the next try; the lease in hand went back
        outcome = self._outcome(context, ledger, run)
        kind, detail = outcome[0], outcome[1]
        token = str(run.conf["claim_token"])
        with report.lock:
            if kind == "committed" or kind == "repeated":
                report.committed.append(dict(run.conf))
                report.repeated += kind == "repeated"
            elif kind == "failed":
                report.failed[token] = str(detail)
                report.failed_confs.append(dict(run.conf))
            elif kind == "wait":
                report.waits[token] = float(detail)
            elif kind == "left":
                report.left[token] = str(detail)
            else:
                report.passed_over += 1
        if kind == "committed":
            chain.checkpoint(f"{self.step}.committed")

    def _outcome(self, context: Context, ledger: Ledger, run: StepRun) -> tuple[str, Any]:
        """The step on one article: ``(kind, detail)``, kind ``committed``, ``repeated``,
        ``failed``, ``wait`` (seconds), ``left`` (why) or ``passed``."""
        from onceflow.articles.errors import TransientStepError
        from onceflow.compat import AirflowFailException, AirflowSkipException
        from onceflow.ledger import LeaseHeld, StaleFenceError, WrongVersion
        from onceflow.ledger.steps import InvalidInput
        from onceflow.ledger.worker import ShutdownRequested

        try:
            _, outcome = self.run_step(context, ledger, run.conf, run)
        except (AirflowFailException, ShutdownRequested):
            raise  # a broken connection fails every article alike; a stop stops the task
        except AirflowSkipException as exc:  # not this article's step after all (a rejection)
            self.log.info("%s", exc)
            return "passed", None
        except InvalidInput as exc:  # recorded: needs_correction, and the row's FAILED in the outbox
            self.log.warning("%s of %s failed for good: %s", self.step, run.work_key, exc)
            return "failed", exc
        except StaleFenceError as exc:  # a newer try holds the item: for it, or for our retry
            return "left", f"lease taken over: {exc}"
        except LeaseHeld as exc:
            return "wait", self.lease_wait(exc)
        except WrongVersion as exc:
            self.log.warning("%s", exc)
            return "wait", float(self.version_wait_seconds)
        except TransientStepError as exc:
            self.log.warning("%s of %s left for later: %s", self.step, run.work_key, exc)
            if exc.retry_after is not None:
                return "wait", float(exc.retry_after)
            return "left", exc
        except Exception as exc:  # recorded as a transient failure of the item (run_keyed_step)
            self.log.exception("%s of %s left for the retry", self.step, run.work_key)
            return "left", f"{type(exc).__name__}: {exc}"
        return ("repeated" if outcome.repeated else "committed"), None

    def _relay(self, ledger: Ledger, report: BatchReport) -> None:
        """One relay pass per sheet for the step's row moves: the FAILED rows of permanent
        failures, and this step's own when it moves rows (``relays``)."""
        from onceflow.articles.errors import TransientStepError

        confs = list(report.committed) if self.relays else []
        failed = set(report.failed)
        if not confs and not failed:
            return
        # one pass per sheet relays every pending row of it (any conf of the sheet opens its queue)
        by_sheet: dict[tuple[Any, Any], dict[str, Any]] = {}
        for conf in [*confs, *report.failed_confs]:
            by_sheet.setdefault((conf.get("spreadsheet_id"), conf.get("sheet")), conf)
        for conf in by_sheet.values():
            try:
                result = relay_claimed_sheet(ledger, conf, self.queue_of(conf))
            except Exception as exc:
                if self.relays and confs:
                    raise TransientStepError(f"write-back relay: {exc}", step=self.step) from exc
                self.log.exception("could not relay the FAILED rows; the next relay pass will")
                continue
            if result.errors:
                if self.relays and confs:
                    raise TransientStepError(f"write-back relay: {result.errors[0]}", step=self.step)
                self.log.warning("FAILED rows not relayed yet: %s", result.errors[0])
            for token in failed & set(result.left):
                self.log.warning(
                    "the row of claim %s was not in flight for its article: FAILED not written", token
                )

    def _wait_batch(self, report: BatchReport, waits: int) -> None:
        """Defer until the latest held lease (or ``Retry-After``) is over, then run the step again
        for what is left; past ``max_waits`` they join the transient failures."""
        from datetime import timedelta

        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        if waits >= self.max_waits:
            report.left.update({t: f"still waiting after {waits} deferrals" for t in report.waits})
            report.waits.clear()
            return
        seconds = max(report.waits.values())
        self.log.warning(
            "%s: %d article(s) wait (held leases, Retry-After): deferring %.0fs, then the step again "
            "for what is left (wait %d)", self.step, len(report.waits), seconds, waits + 1,
        )  # fmt: skip
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=seconds)),
            method_name="execute_after_wait",
            kwargs={"waits": waits + 1},
        )

    def _retry_or_drop(self, context: Context, report: BatchReport) -> None:
        """Transient failures: Airflow's retry (only they are worked on again), or on the last try
        leave them to ``sheet_reconcile`` and succeed for the rest."""
        from onceflow.articles.errors import TransientStepError

        ti = context["ti"]
        last = int(ti.try_number) > int(getattr(ti, "max_tries", 0) or 0)
        first = next(iter(report.left.items()))
        if not last or not (report.committed or report.failed):
            raise TransientStepError(
                f"{self.step}: {len(report.left)} article(s) left for the retry (claim {first[0]}: "
                f"{first[1]}); {len(report.committed)} committed, {len(report.failed)} failed for good",
                step=self.step,
            )
        self.log.error(
            "%s: last try; %d article(s) still failing are dropped from the batch (their rows stay "
            "PROCESSING; sheet_reconcile re-drives each alone once past the lease): %s",
            self.step, len(report.left), report.left,
        )  # fmt: skip

    def _skip_unreached(
        self, context: Context, ledger: Ledger, claims: list[dict[str, Any]], threshold: float
    ) -> None:
        """Skip the ``skip_if_none`` tasks no article of the batch would reach (no task process)."""
        unreached = []
        for task_id in self.skip_if_none:
            task = context["dag"].get_task(task_id)
            if isinstance(task, BatchStep) and not task.members(context, ledger, claims, threshold)[0]:
                unreached.append(task)
        if unreached:
            self.log.info("no article reaches %s: skipped", [t.task_id for t in unreached])
            self.skip(ti=context["ti"], tasks=unreached)


# -- the chain's steps in the batch lane (``dags/article_batch.py``) --------------------------------
class ClaimedRowBatchOperator(BatchStep, ClaimedRowOperator):
    """``read_claimed_row`` for every claim of the batch: every row read back by its token and
    checked, and given the batch run's id, in 1 read + 1 write for the whole batch
    (:func:`~onceflow.operators.sheets.read_claimed_rows`, before the keyed steps); each article
    then commits its own result under its own lease. A row that read cannot settle (gone, moved
    to another article, a stray anchor) goes the per-article way inside its step, which repairs
    it or fails that article with the reason (1 read + 1 write for it)."""

    def before_batch(self, context: Context, runs: list[StepRun]) -> None:
        from onceflow.operators.sheets import read_claimed_rows

        self._read: dict[str, dict[str, Any]] = {}
        by_queue: dict[tuple[Any, ...], list[StepRun]] = {}
        for run in runs:
            key = (run.conf.get("spreadsheet_id"), run.conf.get("sheet"), run.conf.get("processing_version"))
            by_queue.setdefault(key, []).append(run)
        for group in by_queue.values():
            try:
                read = read_claimed_rows(
                    self.queue_of(group[0].conf), [r.conf for r in group], group[0].run_id
                )
            except Exception:  # each article reads its row alone instead
                self.log.exception("could not read the batch's rows at once; reading them one by one")
                continue
            self._read.update(read)

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        found = getattr(self, "_read", {}).pop(str(run.conf["claim_token"]), None)
        return found if found is not None else super().work(run, context)


class FetchBatchOperator(BatchStep, FetchArticleOperator):
    """``fetch`` for the articles whose row was read in this run."""

    after = "read_claimed_row"


class ExtractBatchOperator(BatchStep, ExtractArticleOperator):
    """``extract`` for the articles fetched in this run."""

    after = "fetch"


class TranslateBatchOperator(BatchStep, TranslateArticleOperator):
    """``translate`` for the articles extracted in this run, two at a time (each chunk is an
    Apertium process: the work is outside Python, so two threads keep two cores busy)."""

    after = "extract"
    default_concurrency = 2


class ScoreBatchOperator(BatchStep, ScoreArticleOperator):
    """``score`` for the articles translated in this run."""

    after = "translate"


class PolishBatchOperator(BatchStep, PolishArticleOperator):
    """``polish`` for the articles scored under the threshold in this run (one glossary read)."""

    after = "score"

    def admits(self, run: StepRun, threshold: float) -> bool:
        value = score_of(run, "score")
        return value is not None and value < threshold


class PublishBatchOperator(BatchStep, PublishArticleOperator):
    """``publish`` for the articles whose final score (polish's, else score's) reaches the
    threshold; each commits its row's DONE to the outbox. Approved reviews publish apart."""

    after = "score"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("review_task_id", None)  # nobody reviewed what this step publishes
        super().__init__(**kwargs)

    def admits(self, run: StepRun, threshold: float) -> bool:
        value = final_score(run)
        return value is not None and value >= threshold


class WriteBackBatchOperator(BatchStep, WriteBackOperator):
    """``write_back`` for the articles published in this run: the first relays every pending
    write-back of the sheet (the batch's DONE rows among them, 1 read + 2 writes), the others
    find theirs relayed and commit their result."""

    after = "publish"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("review_task_id", None)
        super().__init__(**kwargs)


class MarkNeedsReviewBatchOperator(BatchStep, MarkNeedsReviewOperator):
    """``mark_needs_review`` for the articles still under the threshold after ``polish``: their
    rows go NEEDS_REVIEW (one relay pass), and it returns their claims for the per-article
    review to map over."""

    after = "polish"
    returns_claims = True

    def admits(self, run: StepRun, threshold: float) -> bool:
        value = score_of(run, "polish")
        return value is not None and value < threshold
