"""article_batch: the batch lane, one run per batch of up to N claimed rows (created by ``sheet_claim``
with ``batch_size`` >= 2), each task carrying one step of the chain for every article of the batch."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, task_group

from onceflow.compat import retry_backoff
from onceflow.operators.article_batch import (
    ClaimedRowBatchOperator,
    ExtractBatchOperator,
    FetchBatchOperator,
    MarkNeedsReviewBatchOperator,
    PolishBatchOperator,
    PublishBatchOperator,
    ScoreBatchOperator,
    TranslateBatchOperator,
    WriteBackBatchOperator,
)
from onceflow.operators.articles import ArticleReviewOperator, PublishArticleOperator, WriteBackOperator

DOC_MD = """
### article_batch

The batch lane of the article chain. `sheet_claim` with `batch_size` of 2 or more (a param of
its trigger form; 0, the default, makes one `article_pipeline` run per row) claims the rows in
the sheet as always, registers each in the ledger, and creates one run of this DAG per batch of
up to `batch_size` new articles, run id `batch__<first claim token>`, the claims in its conf.

**One task, one step, N articles.** `read_claimed_row` >> `fetch` >> `extract` >> `translate` >>
`score` >> `polish` (only the articles under the threshold; skipped when none is) >> `publish`
(the articles at or above it) >> `write_back` (one relay pass writes every row's DONE).
Each article is still its own fenced ledger step in every task (its own lease and fencing token,
its own result and outbox row), so a retry repeats nothing committed and a crash publishes
nothing twice. A permanent failure of one article (a 404, a language without a translator) marks
that row FAILED with its reason and the others go on; a transient one is retried for that
article alone.

**Review per article.** The articles still under the threshold after `polish` are marked
NEEDS_REVIEW (`mark_needs_review`) and each gets its own `review_article` (a mapped task group:
`review` is a human-in-the-loop approval like `article_pipeline`'s, then its own `publish` and
`write_back`). Answer them under Required actions, or through the REST API at
`.../taskInstances/review_article.review/<map index>/hitlDetails`.

Docs: `docs/articles.md` ("The batch lane").
"""

#: The batch lane's DAG id (``sheet_claim``'s ``batch_dag_id``).
BATCH_DAG_ID = "article_batch"


@dag(
    dag_id=BATCH_DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["onceflow", "sheet-queue", "lane:batch"],
    doc_md=DOC_MD,
    default_args={
        "owner": "onceflow",
        "retries": 3,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": retry_backoff(2.0),
        "max_retry_delay": timedelta(minutes=10),
    },
    max_active_runs=16,  # a run waiting for a review holds one
)
def article_batch() -> None:
    read = ClaimedRowBatchOperator(task_id="read_claimed_row")
    fetch = FetchBatchOperator(task_id="fetch")
    extract = ExtractBatchOperator(task_id="extract")
    translate = TranslateBatchOperator(task_id="translate")
    score = ScoreBatchOperator(task_id="score", skip_if_none=["polish"])
    polish = PolishBatchOperator(task_id="polish", skip_if_none=["publish", "mark_needs_review"])
    publish = PublishBatchOperator(task_id="publish")
    write_back = WriteBackBatchOperator(task_id="write_back")
    needs_review = MarkNeedsReviewBatchOperator(task_id="mark_needs_review")

    @task_group(group_id="review_article")
    def review_article(claim: Any) -> None:
        review = ArticleReviewOperator(task_id="review", claim=claim)
        # each map index reads the answer of its own review (review_article.review)
        approved = PublishArticleOperator(task_id="publish", claim=claim, review_task_id=review.task_id)
        written = WriteBackOperator(task_id="write_back", claim=claim, review_task_id=review.task_id)
        review >> approved >> written

    read >> fetch >> extract >> translate >> score >> [publish, polish]
    polish >> [publish, needs_review]
    publish >> write_back
    needs_review >> review_article.expand(claim=needs_review.output)


article_batch()
