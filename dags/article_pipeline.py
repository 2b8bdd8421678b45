"""article_pipeline: one run per claimed sheet row (created by ``sheet_claim`` or ``sheet_reconcile``),
and article_pipeline_recheck: the same chain in the recheck lane (runs created by ``recheck``)."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from onceflow.compat import retry_backoff
from onceflow.lanes import LANES, NEW_LANE, RECHECK_LANE
from onceflow.operators.articles import (
    ArticleReviewOperator,
    ExtractArticleOperator,
    FetchArticleOperator,
    MarkNeedsReviewOperator,
    PolishArticleOperator,
    PublishArticleOperator,
    ScoreArticleOperator,
    ScoreBranchOperator,
    TranslateArticleOperator,
    WriteBackOperator,
)
from onceflow.operators.sheets import ClaimedRowOperator

DOC_MD = """
### article_pipeline

One run per claimed row of the article queue sheet. Runs are created only by `sheet_claim`
(after the row is claimed in the sheet) and by `sheet_reconcile` (repairing a claim that has no
run), always with the deterministic run id `sheet__<row key>__<processing version>`, so Airflow
refuses a second run for the same article.

The run's conf carries the row's claim token; every task finds the row **by that token**, never
by its position (the editor may sort, insert and delete rows at any time): reads and writes go
through the row anchor (developer metadata `onceflow.claim = <token>`) the claim put on the row.

**The chain.** Every task after it is a fenced keyed step on the same ledger item, committing
its result under its own lease; each stores its output (keyed by row key, processing version,
step and fencing token) and commits the output's URI and sha256, which the next step reads from
the ledger (not from XCom): `fetch` (SSRF guard, size cap, pool `onceflow_fetch`) >> `extract`
>> `translate` (Apertium or Cloud Translation, pool `onceflow_translate`) >> `score` >>
`check_score`: at or above the threshold (Variable `onceflow_score_threshold`, default 0.7)
straight to `publish`; below it `polish` (the sheet's glossary, then score again) >>
`check_polished`: still below, `mark_needs_review` (row NEEDS_REVIEW, through the outbox) >> `review`, a
human-in-the-loop approval showing the text, the score and the source link (approve: publish;
reject: the row ends REJECTED with the reviewer's note) >> `publish` (sanitized page,
create-only: published once; its commit carries the row's DONE, score and link into the ledger's
outbox) >> `write_back` (relays the sheet's pending write-backs, this row's among them).
A retry repeats nothing the run already committed; a permanent failure (a blocked URL, a 404, an
empty page) commits the row's FAILED with the reason to the outbox, relays it, and is not retried; a transient one (timeout,
5xx, 429) is retried with exponential backoff, after the server's Retry-After when it sent one.

**Two lanes, two DAGs from this file.** `article_pipeline` takes new work (pool `onceflow_sheets`,
16 active runs). `article_pipeline_recheck` takes the runs the `recheck` DAG dispatches (conf
`onceflow_lane="recheck"`): the same tasks, every one in pool `onceflow_recheck` at priority
weight -100, with its own 4 active runs, so a recheck of thousands of articles never delays a new
one. Pause `article_pipeline_recheck` to hold rechecks back without touching new work. A run sent
to the other lane's DAG fails at once, naming the right one.

**Stopping a run.** Marking a running task failed, or any SIGTERM Airflow sends it, hands the
article's ledger lease back at once (`release`), so a new attempt need not wait for it to expire.

Docs: `docs/articles.md` (the chain, the review), `docs/sheet-queue.md` (claims, rows).
"""

#: The new-work lane's DAG id; the recheck lane's is this plus ``_recheck``.
CHAIN_DAG_ID = "article_pipeline"


def article_pipeline(lane_name: str) -> None:
    """The chain DAG of one lane (``onceflow.lanes``): new work, or rechecks apart from it."""
    lane = LANES[lane_name]

    @dag(
        dag_id=lane.dag_id(CHAIN_DAG_ID),
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        tags=["onceflow", "sheet-queue", f"lane:{lane.name}"],
        doc_md=DOC_MD,
        default_args={
            "owner": "onceflow",
            "retries": 3,
            "retry_delay": timedelta(seconds=30),
            "retry_exponential_backoff": retry_backoff(2.0),  # on 3.1: on, Airflow's factor
            "max_retry_delay": timedelta(minutes=10),
        },
        max_active_runs=lane.max_active_runs,
    )
    def chain() -> None:
        args = {"lane": lane.name, **lane.task_args()}
        read = ClaimedRowOperator(task_id="read_claimed_row", **args)
        fetch = FetchArticleOperator(task_id="fetch", **args)
        extract = ExtractArticleOperator(task_id="extract", **args)
        translate = TranslateArticleOperator(task_id="translate", **args)
        score = ScoreArticleOperator(task_id="score", **args)
        check_score = ScoreBranchOperator(
            task_id="check_score", score_step="score", above="publish", below="polish", **args
        )
        polish = PolishArticleOperator(task_id="polish", **args)
        check_polished = ScoreBranchOperator(
            task_id="check_polished", score_step="polish", above="publish", below="mark_needs_review", **args
        )
        needs_review = MarkNeedsReviewOperator(task_id="mark_needs_review", **args)
        review = ArticleReviewOperator(task_id="review", **args)
        publish = PublishArticleOperator(task_id="publish", **args)
        write_back = WriteBackOperator(task_id="write_back", **args)

        read >> fetch >> extract >> translate >> score >> check_score >> [publish, polish]
        polish >> check_polished >> [publish, needs_review]
        needs_review >> review >> publish >> write_back

    chain()


article_pipeline(NEW_LANE)
article_pipeline(RECHECK_LANE)
