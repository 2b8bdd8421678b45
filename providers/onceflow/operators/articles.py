"""The article chain's operators: one thin operator per step, the score branches, the review.

Each step operator is an :class:`~onceflow.operators.article_step.ArticleStepOperator` (fenced
keyed step on ``article:<row key>``) whose :meth:`work` builds the hooks it needs and calls one
function of :mod:`onceflow.articles.chain`. The branches and the review read the score from the
ledger results of the run, not from XCom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator, Param

from onceflow.hitl_guard import REQUIRED_FOR_KEY
from onceflow.operators.article_step import (
    ArticleStepOperator,
    claim_target,
    row_status,
    run_claim_conf,
    step_run,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from onceflow.articles.chain import StepRun

#: Default publication threshold (the Airflow Variable ``onceflow_score_threshold`` overrides it).
SCORE_THRESHOLD = 0.7
THRESHOLD_TEMPLATE = "{{ var.value.get('onceflow_score_threshold', '" + str(SCORE_THRESHOLD) + "') }}"


def _step_store() -> Any:
    from onceflow.hooks.storage import StorageHook

    return StorageHook().step_store()


class FetchArticleOperator(ArticleStepOperator):
    """GET the row's URL (SSRF guard, size cap, timeouts; connection ``onceflow_fetch``)."""

    step = "fetch"

    def __init__(self, *, fetch_conn_id: str = "onceflow_fetch", **kwargs: Any) -> None:
        kwargs.setdefault("pool", "onceflow_fetch")
        super().__init__(**kwargs)
        self.fetch_conn_id = fetch_conn_id

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain
        from onceflow.hooks.fetch import FetchHook

        # no connection: the default policy (public addresses only); a broken one is an error
        policy = self.cached("fetch policy", lambda: FetchHook(self.fetch_conn_id).policy)
        return chain.fetch(run, self.step_store(), policy)


class ExtractArticleOperator(ArticleStepOperator):
    """Title, main text and language of the fetched page (trafilatura, lingua)."""

    step = "extract"

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain

        return chain.extract(run, self.step_store())


class TranslateArticleOperator(ArticleStepOperator):
    """Translate through the backend of connection ``onceflow_translate`` (Apertium by default)."""

    step = "translate"

    def __init__(self, *, translate_conn_id: str = "onceflow_translate", **kwargs: Any) -> None:
        kwargs.setdefault("pool", "onceflow_translate")
        super().__init__(**kwargs)
        self.translate_conn_id = translate_conn_id

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain
        from onceflow.compat import AirflowFailException
        from onceflow.hooks.translate import TranslateConfigError, TranslateHook

        try:
            hook = self.cached("translate hook", lambda: TranslateHook(conn_id=self.translate_conn_id))
            max_chars = int(hook.max_chars)
        except TranslateConfigError as exc:
            # the connection is wrong, not the article: no retry can help, and the row is not
            # marked FAILED; the ledger records the failure and sheet_reconcile re-drives the
            # article once the connection is fixed (docs/articles.md)
            raise AirflowFailException(f"{exc}; fix the connection, the article is re-driven after") from exc
        return chain.translate(run, self.step_store(), hook.get_translator, max_chars)


class ScoreArticleOperator(ArticleStepOperator):
    """Score the translation (unknown words, target language, length ratio, untranslated text)."""

    step = "score"

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain

        return chain.score(run, self.step_store())


class PolishArticleOperator(ArticleStepOperator):
    """Glossary substitutions (the sheet's glossary tab), then score again."""

    step = "polish"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pool", "onceflow_sheets")  # it reads the glossary tab
        super().__init__(**kwargs)

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain
        from onceflow.articles.polish import read_glossary

        queue = self.queue_of(run.conf)
        spreadsheet = str(getattr(queue.transport, "spreadsheet_id", ""))
        # one read of the glossary tab per task: a batch step's articles share it
        glossary = self.cached(("glossary", spreadsheet), lambda: read_glossary(queue.transport, spreadsheet))
        return chain.polish(run, self.step_store(), glossary)


class PublishArticleOperator(ArticleStepOperator):
    """Publish the sanitized page create-only at the article's deterministic path.

    Runs when the score passed, or the reviewer approved (trigger rule: none failed, one success).

    :param review_task_id: the review whose answer names the approver (``None``: no review
        precedes this task, as in the batch lane's publish of the articles that passed).
    """

    step = "publish"

    def __init__(self, *, review_task_id: str | None = "review", **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "none_failed_min_one_success")
        super().__init__(**kwargs)
        self.review_task_id = review_task_id

    def run_step(
        self, context: Context, ledger: Any, conf: dict[str, Any], run: StepRun | None = None
    ) -> tuple[StepRun, Any]:
        """Refuse, before any lease, to publish an article this run's reviewer rejected (the
        ledger's ``review`` step): the review's skip of this task does not reach a task mapped
        with it that Airflow has not expanded yet (a mapped task group), so this is the guard."""
        from onceflow.compat import AirflowSkipException

        run = run if run is not None else step_run(context, ledger, conf)
        if run.result("review", required=False).get("decision") == "rejected":
            raise AirflowSkipException(f"{run.work_key} was rejected in review: not published")
        return super().run_step(context, ledger, conf, run)

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain

        publisher = self.cached("publisher", lambda: self.storage_hook().publisher())
        return chain.publish(run, self.step_store(), publisher)

    def follow_ups(self, run: StepRun, result: dict[str, Any], context: Context) -> Sequence[Any]:
        """The row's DONE, score and link, committed with the result (the relay writes it)."""
        from onceflow.articles import chain

        return [chain.done_write(run, claim_target(run.conf), result, self.approved_by(context))]

    def approved_by(self, context: Context) -> str | None:
        """Who approved the article in review: the review task's answer (None when nobody was
        asked; the review of this map index when the review is mapped)."""
        return responder_name(review_answer(context, self.review_task_id))


class WriteBackOperator(ArticleStepOperator):
    """Relay the sheet's pending write-backs: this row's DONE, score and link (committed by
    ``publish``) and every other row's waiting in the outbox, in 1 read + 2 writes.

    :param review_task_id: as :class:`PublishArticleOperator`'s.
    """

    step = "write_back"

    def __init__(self, *, review_task_id: str | None = "review", **kwargs: Any) -> None:
        kwargs.setdefault("pool", "onceflow_sheets")
        super().__init__(**kwargs)
        self.review_task_id = review_task_id

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles import chain

        # the review's answer (None when the score passed and nobody was asked)
        approved_by = responder_name(review_answer(context, self.review_task_id))
        return chain.write_back(run, self.queue_of(run.conf), approved_by=approved_by)


def review_answer(context: Context, review_task_id: str | None) -> Any:
    """The answer of the review task ``review_task_id`` (None when there is none or nobody was
    asked). A task mapped with its review (a mapped task group, one map index per article) reads
    the review of its own map index; unmapped, the review's one answer."""
    if review_task_id is None:
        return None
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    if map_index is not None and map_index >= 0:
        return ti.xcom_pull(task_ids=review_task_id, map_indexes=map_index)
    return ti.xcom_pull(task_ids=review_task_id)


def responder_name(answer: Any) -> str | None:
    """Who answered a HITL request, from its payload (``responded_by_user``), or None."""
    if not isinstance(answer, dict):
        return None
    user = answer.get("responded_by_user")
    name = user.get("name") if isinstance(user, dict) else getattr(user, "name", None)
    return str(name).strip() or None if name else None


def _run_view(
    op: BaseOperator, context: Context, ledger_conn_id: str, lane: str, claim: dict[str, Any] | None = None
) -> StepRun:
    """The article's claim (``claim``, else the run's conf) and this run's results, for the tasks
    that are not ledger steps."""
    from onceflow.hooks.ledger import LedgerHook

    ledger = LedgerHook(ledger_conn_id).get_ledger()
    return step_run(context, ledger, run_claim_conf(context, ledger, lane, op.dag_id, claim))


class ScoreBranchOperator(BaseBranchOperator):
    """``above`` when the score ``step`` committed in this run reaches ``threshold``, else ``below``.

    :param score_step: ``score`` (the translation's score) or ``polish`` (the score after it).
    :param threshold: the publication threshold (templated; 0..1).
    """

    template_fields: Sequence[str] = ("threshold",)
    ui_color = "#fff2cc"

    def __init__(
        self,
        *,
        score_step: str,
        above: str,
        below: str,
        threshold: float | str = THRESHOLD_TEMPLATE,
        ledger_conn_id: str = "onceflow_ledger",
        lane: str = "new",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.score_step = score_step
        self.above, self.below = above, below
        self.threshold = threshold
        self.ledger_conn_id = ledger_conn_id
        self.lane = lane

    def choose_branch(self, context: Context) -> str:
        run = _run_view(self, context, self.ledger_conn_id, self.lane)
        value = float(run.result(self.score_step)["value"])
        threshold = float(self.threshold)
        branch = self.above if value >= threshold else self.below
        self.log.info("%s score %.3f, threshold %.3f: %s", self.score_step, value, threshold, branch)
        return branch


class MarkNeedsReviewOperator(ArticleStepOperator):
    """The row goes to NEEDS_REVIEW with the score and why, before the run waits for a reviewer.

    A ledger step: its result and the row's NEEDS_REVIEW (a ``sheet_row`` follow-up, the anchor
    kept) commit together, then the sheet relay writes it; a retry after the commit only relays.
    """

    step = "mark_needs_review"
    relays = True
    template_fields: Sequence[str] = (*ArticleStepOperator.template_fields, "threshold")

    def __init__(self, *, threshold: float | str = THRESHOLD_TEMPLATE, **kwargs: Any) -> None:
        kwargs.setdefault("pool", "onceflow_sheets")
        super().__init__(**kwargs)
        self.threshold = threshold

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        from onceflow.articles.chain import final_parts, why_below

        polished = run.result("polish")
        reasons = "; ".join(why_below(list(polished.get("reasons") or []), final_parts(run)))
        reason = (
            f"score {float(polished['value']):.2f} below {float(self.threshold):.2f} after polish: {reasons}"
        )
        return {"status": "NEEDS_REVIEW", "reason": reason, "score": float(polished["value"])}

    def follow_ups(self, run: StepRun, result: dict[str, Any], context: Context) -> Sequence[Any]:
        from onceflow.articles.writeback import needs_review_fields
        from onceflow.sheets.model import Status

        fields = needs_review_fields(score=float(result["score"]), reason=str(result["reason"]))
        return [row_status(run, Status.NEEDS_REVIEW, fields, old=(Status.PROCESSING,))]


class ArticleReviewOperator(ApprovalOperator):
    """Human in the loop: approve (publish) or reject (the row ends REJECTED with the note).

    The request (text, score and source link in the body) and the answer live in Airflow's
    metadata DB (``hitl_detail``); the task waits in ``awaiting_input``, so the decision survives
    restarts of the scheduler and the api-server. A rejection skips ``publish`` and the rest.

    :param claim: the claim conf to review instead of the run's (templated; a review mapped over
        the articles of a batch run that need one gets one each).
    """

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "threshold", "claim")

    def __init__(
        self,
        *,
        threshold: float | str = THRESHOLD_TEMPLATE,
        ledger_conn_id: str = "onceflow_ledger",
        lane: str = "new",
        claim: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("subject", "Review a machine translation before it is published")
        # Approve needs no note, Reject does. Airflow's form requires a param whose type does not
        # allow null for every option (it greyed out Approve until something was typed), so the
        # type allows null and the api-server refuses a Reject without it (onceflow.hitl_guard).
        kwargs.setdefault(
            "params",
            {
                "note": Param(
                    None,
                    type=["null", "string"],
                    description="Required to Reject: why (it becomes the row's reason). Approve needs none.",
                    **{REQUIRED_FOR_KEY: [ApprovalOperator.REJECT]},  # type: ignore[arg-type]
                )
            },
        )
        kwargs.setdefault("ignore_downstream_trigger_rules", True)
        super().__init__(**kwargs)
        self.threshold = threshold
        self.ledger_conn_id = ledger_conn_id
        self.lane = lane
        self.claim = claim

    def execute(self, context: Context) -> Any:
        from onceflow.articles import chain

        run = _run_view(self, context, self.ledger_conn_id, self.lane, self.claim)
        self.body = chain.review_body(run, _step_store(), float(self.threshold))
        self.subject = f"Review: {run.conf.get('url', run.row_key)}"
        return super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the reviewer answered: a rejection commits the decision and the row's
        REJECTED with the note (one ledger transaction, ledger step ``review``) and relays it; an
        approval lets the chain publish."""
        chosen = (event.get("chosen_options") or [None])[0] if "error" not in event else None
        if chosen == self.REJECT:
            note = (
                str((event.get("params_input") or {}).get("note") or "").strip() or "rejected by the reviewer"
            )
            who = responder_name(event) or ""
            self._reject(context, f"{note} ({who})" if who else note)
        return super().execute_complete(context, event)

    def _reject(self, context: Context, note: str) -> None:
        from onceflow.articles.writeback import rejected_fields
        from onceflow.ledger.steps import run_keyed_step
        from onceflow.operators.article_step import relay_claimed_sheet
        from onceflow.sheets.keys import RUN_CONF_KEYS
        from onceflow.sheets.ledger_link import KIND
        from onceflow.sheets.model import Status

        run = _run_view(self, context, self.ledger_conn_id, self.lane, self.claim)
        score = float(run.result("polish")["value"])
        write = row_status(
            run, Status.REJECTED, rejected_fields(note=note, score=score), old=(Status.NEEDS_REVIEW,)
        )
        ti = context["ti"]
        run_keyed_step(
            run.ledger,
            kind=KIND,
            work_key=run.work_key,
            step="review",
            owner=f"{ti.dag_id}/{ti.run_id}/{ti.try_number}/{ti.task_id}",
            worker_version=run.version,
            work=lambda _lease: {"decision": "rejected", "note": note, "score": score},
            reuse_prefix=run.reuse_prefix,
            payload={k: run.conf[k] for k in RUN_CONF_KEYS if k in run.conf},
            follow_ups=lambda _result: [write],
        )
        try:  # the decision is committed: a relay that fails leaves the row to the next pass
            report = relay_claimed_sheet(run.ledger, run.conf)
        except Exception:
            self.log.exception("could not relay the row's REJECTED; the next relay pass will")
            return
        if report.errors:
            self.log.warning("REJECTED not relayed yet: %s", report.errors[0])
