"""The article chain's steps, one function each, without Airflow.

Every step runs inside :func:`onceflow.ledger.steps.run_keyed_step` (the operators in
:mod:`onceflow.operators.articles` call them), gets the lease's fencing token through
:class:`StepRun`, reads the previous step's output from the URI its **committed ledger result**
names (never from XCom), stores its own output through the ``StepStore`` keyed by row key,
processing version, step and token, and returns the small payload the ledger commits: the
output's URI and sha256 plus what the next decision needs (a score, a language). A crash between
the output write and the commit leaves an orphaned file under the old token; the retry writes
under its new token and commits that one. Publishing is create-only at a path without the token,
so a repeat returns the same URL and writes nothing.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.articles.errors import PermanentStepError

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger
    from onceflow.ledger.models import ResultRecord

log = logging.getLogger(__name__)

FETCH, EXTRACT, TRANSLATE, SCORE, POLISH, PUBLISH, WRITE_BACK = (
    "fetch",
    "extract",
    "translate",
    "score",
    "polish",
    "publish",
    "write_back",
)
#: The language articles are translated into (Apertium's ``spa-eng`` pair, the demo's direction).
TARGET_LANGUAGE = "en"
#: Most characters of the page's title that ``extract`` commits to the ledger (``run_notes``).
LEDGER_TITLE_CHARS = 300
#: Most characters of the translated text shown to a reviewer in the HITL body.
REVIEW_TEXT_CHARS = 6000
_AUTOLINK = re.compile(r"https?://[^\s<>`\\]+")


def checkpoint(stage: str) -> None:
    """A named point of a step (``fetch.stored``, ``translate.committed``, ``publish.stored``...).

    Nothing happens here in production; ``onceflow.testing.crash_points`` replaces it in a crash
    test's task processes to pause the task at one point and kill it there.
    """


class MissingResult(LookupError):
    """A step's input is not in the ledger: the previous step did not commit in this run."""


@dataclass
class StepRun:
    """One attempt of one step on one article: who it is, and the results committed before it.

    :param reuse_prefix: committer prefix of this Airflow run (``<dag id>/<run id>/``); results of
        other runs (an earlier processing, a recheck) are not this run's inputs.
    """

    ledger: Ledger
    work_key: str
    row_key: str
    version: str
    conf: dict[str, Any]
    run_id: str
    reuse_prefix: str
    token: int = 0
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def result(self, step: str, *, required: bool = True) -> dict[str, Any]:
        """The payload ``step`` committed in this run at this version (the newest token's)."""
        if step not in self._cache:
            newest = run_result(self.ledger.results(self.work_key), step, self.reuse_prefix, self.version)
            self._cache[step] = dict(newest.payload) if newest is not None else None
        found = self._cache[step]
        if found is None:
            if required:
                raise MissingResult(
                    f"{self.work_key}: no {step!r} result committed by this run ({self.reuse_prefix}) "
                    f"at version {self.version}"
                )
            return {}
        return dict(found)


def run_result(
    records: Iterable[ResultRecord], step: str, reuse_prefix: str, version: str | None = None
) -> ResultRecord | None:
    """The newest result (highest fencing token) of ``step`` that the run ``reuse_prefix`` names
    committed, at ``version`` when one is given; ``None`` when it committed none."""
    mine = [
        r
        for r in records
        if r.step == step
        and (version is None or r.processing_version == version)
        and (r.committed_by or "").startswith(reuse_prefix)
    ]
    return max(mine, key=lambda r: r.fencing_token, default=None)


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (how a step's output is checked by the next step)."""
    return hashlib.sha256(data).hexdigest()


def store_output(store: Any, run: StepRun, step: str, name: str, data: bytes) -> dict[str, Any]:
    """Write one step output under this attempt's token; the ``uri``/``sha256`` pair to commit."""
    uri = store.write(run.row_key, run.version, step, run.token, name, data)
    checkpoint(f"{step}.stored")
    return {"uri": str(uri), "sha256": sha256(data), "bytes": len(data)}


def load_output(store: Any, payload: dict[str, Any]) -> bytes:
    """The bytes a committed result names, checked against its sha256."""
    data: bytes = store.read(payload["uri"])
    if sha256(data) != payload["sha256"]:
        # outputs are written once per token, so this is damage, not a race: do not build on it
        raise RuntimeError(f"{payload['uri']}: content does not match the committed sha256")
    return data


def store_json(store: Any, run: StepRun, step: str, obj: Any) -> dict[str, Any]:
    """Store ``obj`` as the step's ``<step>.json`` output; returns the payload to commit (uri, sha256)."""
    return store_output(store, run, step, f"{step}.json", json.dumps(obj, ensure_ascii=False).encode())


def load_json(store: Any, payload: dict[str, Any]) -> Any:
    """Read back a JSON output named by a committed payload (its sha256 checked)."""
    return json.loads(load_output(store, payload))


def fetch(run: StepRun, store: Any, policy: Any) -> dict[str, Any]:
    """GET the row's URL under the SSRF policy; store the raw body."""
    from onceflow.articles.fetch import fetch_page

    page = fetch_page(str(run.conf["url"]), policy)
    stored = store_output(store, run, FETCH, "page.raw", page.body)
    return {
        **stored,
        "url": page.url,
        "final_url": page.final_url,
        "status": page.status,
        "content_type": page.content_type,
        "charset": page.charset,
        "declared_charset": page.declared_charset,
    }


def extract(run: StepRun, store: Any) -> dict[str, Any]:
    """Title, main text and language of the fetched page (decoded with the fetch's charset)."""
    from onceflow.articles.charset import decode_html
    from onceflow.articles.extract import extract_article

    fetched = run.result(FETCH)
    # the stored raw body, decoded exactly as the fetch decoded it (BOM, header, meta, sniffing)
    page = decode_html(load_output(store, fetched), fetched.get("declared_charset")).text
    found = extract_article(page, fetched.get("final_url") or fetched["url"])
    if not found.text.strip():
        raise PermanentStepError("extract: no article text found on the page", step=EXTRACT)
    doc = {
        "title": found.title,
        "text": found.text,
        "language": found.language,
        "paragraphs": list(found.paragraphs),
    }
    return {
        **store_json(store, run, EXTRACT, doc),
        "language": found.language,
        "chars": len(found.text),
        # the page's title in the ledger too: the run's note names the article by it (run_notes)
        "title": found.title[:LEDGER_TITLE_CHARS],
    }


def translate(
    run: StepRun, store: Any, translator_for: Callable[[str, str], Any], max_chars: int
) -> dict[str, Any]:
    """Title and text into :data:`TARGET_LANGUAGE`, chunked on paragraph boundaries."""
    from onceflow.articles.translate.base import translate_text

    doc = load_json(store, run.result(EXTRACT))
    source = doc.get("language")
    if not source:
        raise PermanentStepError("translate: the article's language could not be detected", step=TRANSLATE)
    translator = translator_for(source, TARGET_LANGUAGE)
    title = translate_text(translator, doc["title"] or "", source, TARGET_LANGUAGE, max_chars=max_chars)
    text = translate_text(translator, doc["text"], source, TARGET_LANGUAGE, max_chars=max_chars)
    out = {
        "title": title.text,
        "text": text.text,
        "chunks": text.chunks,
        "backend": text.backend,
        "source": source,
        "target": TARGET_LANGUAGE,
    }
    return {**store_json(store, run, TRANSLATE, out), "backend": text.backend, "source": source}


def score(run: StepRun, store: Any) -> dict[str, Any]:
    """Score the translation from its real signals (unknown words, language, length, leftovers)."""
    from onceflow.articles.score import score_translation

    source = load_json(store, run.result(EXTRACT))
    done = load_json(store, run.result(TRANSLATE))
    found = score_translation(
        source["text"], done["text"], source_lang=done["source"], target_lang=done["target"]
    )
    out = {"value": float(found.value), "parts": dict(found.parts), "reasons": list(found.reasons)}
    return {**store_json(store, run, SCORE, out), **out}


def polish(run: StepRun, store: Any, glossary: Any) -> dict[str, Any]:
    """Glossary substitutions on the translation, then score again (one bounded pass)."""
    from onceflow.articles.polish import polish as apply_glossary
    from onceflow.articles.score import score_translation

    source = load_json(store, run.result(EXTRACT))
    done = load_json(store, run.result(TRANSLATE))
    polished = apply_glossary(done["text"], glossary)
    again = score_translation(
        source["text"], polished.text, source_lang=done["source"], target_lang=done["target"]
    )
    out = {
        **done,
        "text": polished.text,
        "substitutions": polished.substitutions,
        "score": {"value": float(again.value), "parts": dict(again.parts), "reasons": list(again.reasons)},
    }
    return {
        **store_json(store, run, POLISH, out),
        "value": float(again.value),
        "parts": dict(again.parts),
        "reasons": list(again.reasons),
    }


def final_translation(run: StepRun, store: Any) -> tuple[dict[str, Any], float, list[str]]:
    """The text to publish or review: the polished one when polish ran in this run, with its score."""
    polished = run.result(POLISH, required=False)
    if polished:
        doc = load_json(store, polished)
        return doc, float(polished["value"]), list(polished.get("reasons") or [])
    scored = run.result(SCORE)
    return load_json(store, run.result(TRANSLATE)), float(scored["value"]), list(scored.get("reasons") or [])


def body_html(text: str) -> str:
    """The translated text as paragraphs of escaped HTML (blank lines separate paragraphs)."""
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    return "\n".join(f"<p>{html.escape(p)}</p>" for p in paragraphs)


def publish(run: StepRun, store: Any, publisher: Any) -> dict[str, Any]:
    """Render the page and publish it create-only at the article's deterministic path."""
    from onceflow.articles.page import render_page, sanitize
    from onceflow.articles.publish import publish_path

    doc, value, _ = final_translation(run, store)
    text, title = reader_text(doc)
    fetched = run.result(FETCH)
    source_url = fetched.get("final_url") or fetched["url"]
    attribution = (
        f"Machine translation ({doc.get('backend', '?')}, {doc.get('source', '?')} to "
        f"{doc.get('target', TARGET_LANGUAGE)}) of the article at its source link, by onceflow."
    )
    page = render_page(
        title or source_url,
        sanitize(body_html(text)),
        source_url,
        attribution,
        value,
        doc.get("target", TARGET_LANGUAGE),
    )
    path = publish_path(run.row_key, run.version)
    result = publisher.publish(path, page)
    checkpoint(f"{PUBLISH}.stored")
    if not result.created:
        log.info("%s was already published at %s: nothing written", run.work_key, result.url)
    return {
        "url": result.url,
        "path": str(path),
        "sha256": result.sha256,
        "created": bool(result.created),
        "score": value,
    }


def done_write(run: StepRun, target: str, published: dict[str, Any], approved_by: str | None) -> Any:
    """The ``sheet_row`` follow-up ``publish`` commits with its result: the row of the run's claim
    DONE with score, link and run id, only while its URL still names this article."""
    from onceflow.articles.writeback import done_fields
    from onceflow.sheets.model import Status
    from onceflow.sheets.relay import row_write

    fields = done_fields(
        score=float(published["score"]),
        published_url=str(published["url"]),
        run_id=run.run_id,
        approved_by=approved_by,
    )
    return row_write(target, str(run.conf["claim_token"]), Status.DONE, fields, row_key=run.row_key)


def write_back(run: StepRun, queue: Any, approved_by: str | None = None) -> dict[str, Any]:
    """Relay the sheet's pending write-backs, this article's DONE among them (1 read + 2 writes
    for all of them, :mod:`onceflow.sheets.relay`).

    ``publish`` committed the row's DONE to the ledger's outbox with its result; an article
    published before write-backs went through the outbox has none, and is written here directly.

    :param approved_by: the reviewer who approved it (only for that direct write).
    :raises TransientStepError: the sheet refused the pass (5xx, quota): Airflow's retry relays again.
    """
    from onceflow.articles.errors import TransientStepError
    from onceflow.articles.writeback import write_done
    from onceflow.sheets.relay import claim_writes, queue_target, relay_sheet_rows

    published = run.result(PUBLISH)
    token = str(run.conf["claim_token"])
    relayed = 0
    if not claim_writes(run.ledger, run.work_key, token):
        written = write_done(
            queue,
            token,
            score=float(published["score"]),
            published_url=published["url"],
            run_id=run.run_id,
            row_key=run.row_key,
            reason=f"approved in review by {approved_by}" if approved_by else None,
        )
    else:
        target = queue_target(queue)
        report = relay_sheet_rows(run.ledger, lambda _sid, _tab: queue, target=target)
        if report.errors:
            raise TransientStepError(f"write-back relay of {target}: {report.errors[0]}", step="write_back")
        relayed = report.relayed
        written = token in report.written
        if token not in report.written and token not in report.left:
            # not in this pass: an earlier one (a crashed try's, sheet_claim's) relayed it
            log.info("claim %s: its write-back was relayed before this task", token)
            written = "relayed" in claim_writes(run.ledger, run.work_key, token)
        log.info("relayed %d write-back(s) of %s; requests %s", relayed, target, dict(report.requests))
    if not written:
        # the row is gone, or the editor typed another article's URL into it: it stays in
        # flight for sheet_reconcile
        log.warning(
            "claim %s: no row of article %s in flight any more: DONE was written before, the row "
            "is gone, or its URL now names another article", token, run.row_key,
        )  # fmt: skip
    return {
        "status": "DONE",
        "published_url": published["url"],
        "score": published["score"],
        "written": bool(written),
        "relayed": relayed,
    }


def markdown_text(text: str) -> str:
    """``text`` as literal Markdown: every ASCII punctuation character backslash-escaped.

    The reviewer's body is rendered as Markdown, and the title and text come from a fetched page:
    unescaped, ``[Approve here](https://evil.example)`` would be a link, ``![](https://tracker)``
    an image the reviewer's browser loads, ``<img onerror=...>`` raw HTML. CommonMark allows a
    backslash before any ASCII punctuation and shows the character itself, so nothing survives
    as markup (entities included: ``\\&amp;`` stays text).
    """
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", text)


def reader_text(doc: dict[str, Any]) -> tuple[str, str]:
    """``(text, title)`` as a reader sees them: Apertium's unknown-word markers were signals for
    the score and the reviewer, not for readers (the published page and the review show this)."""
    from onceflow.articles.translate.apertium import strip_markers

    text, title = doc["text"], doc.get("title") or ""
    if doc.get("backend") == "apertium":
        return strip_markers(text), strip_markers(title)
    return text, title


#: How the review names the score's parts (:data:`onceflow.articles.score.WEIGHTS`).
PART_NAMES = {
    "known_words": "words the translator knew",
    "target_language": "confidence the text is in the target language",
    "length": "length against the source",
    "translated_sentences": "sentences translated (not left in the source language)",
}


def why_below(reasons: list[str], parts: dict[str, float] | None) -> list[str]:
    """Why a score is under the publication threshold, one line each: the scorer's reasons, then
    each imperfect part with its value, weakest first (a part under 1.00 is what pulled the score
    down, even when none is under the scorer's own 0.75 and so has a reason of its own)."""
    lines = list(reasons)
    for name, value in sorted((parts or {}).items(), key=lambda kv: (kv[1], kv[0])):
        if value < 1.0:
            lines.append(f"{PART_NAMES.get(name, name)}: {value:.2f} of 1.00")
    return lines or ["every part of the score is at 1.00"]


def review_markdown(
    doc: dict[str, Any],
    value: float,
    reasons: list[str],
    source_url: str,
    threshold: float,
    parts: dict[str, float] | None = None,
) -> str:
    """What the reviewer sees (Markdown): score and why, the source link, the text as readers will
    see it (Apertium's ``*unknown`` markers removed; the unknown words are named in the reasons).

    Everything from the fetched page (title, text, the reasons quoting it) is escaped with
    :func:`markdown_text`; only the layout here is Markdown.
    """
    text, title = reader_text(doc)
    shown = text if len(text) <= REVIEW_TEXT_CHARS else text[:REVIEW_TEXT_CHARS]
    more = "\n\n*[... truncated]*" if len(text) > REVIEW_TEXT_CHARS else ""
    why = "\n".join(f"- {markdown_text(r)}" for r in why_below(reasons, parts))
    # an autolink keeps the source clickable; the fetch only follows http(s), and a URL with
    # spaces or angle brackets (which could close the autolink) is shown as text instead
    source = f"<{source_url}>" if _AUTOLINK.fullmatch(source_url) else markdown_text(source_url)
    return (
        f"**Score {value:.2f}** (threshold {threshold:.2f}) after the glossary pass. "
        f"Why it is below:\n\n{why}\n\n"
        f"**Source:** {source}\n\n"
        f"**Title:** {markdown_text(title)}\n\n**The text as readers will see it:**\n\n---\n\n"
        f"{markdown_text(shown)}{more}\n\n---\n\n"
        "Approve to publish this translation (no note needed); Reject marks the row REJECTED with "
        "your note as its reason."
    )


def review_body(run: StepRun, store: Any, threshold: float) -> str:
    """:func:`review_markdown` of this run's final translation and fetched page."""
    doc, value, reasons = final_translation(run, store)
    fetched = run.result(FETCH)
    return review_markdown(
        doc, value, reasons, fetched.get("final_url") or fetched["url"], threshold, final_parts(run)
    )


def final_parts(run: StepRun) -> dict[str, float]:
    """The parts of the final score (polish's when it ran in this run, else score's)."""
    polished = run.result(POLISH, required=False)
    if polished:
        return dict(polished.get("parts") or {})
    return dict(run.result(SCORE).get("parts") or {})
