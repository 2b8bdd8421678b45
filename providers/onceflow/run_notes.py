"""The article's title in its run's note, written from the scheduler when the run ends.

``sheet_claim`` creates each ``article_pipeline`` run with the note ``<URL> — claimed from row N``
(:func:`onceflow.operators.sheets.claim_note`); the article's title is known only once ``extract``
has read the page, and Airflow's Task SDK gives a running task no way to change its run's note
(the Execution API has none in 3.1-3.3). So :class:`ArticleRunNotes`, a dag-run listener that
:class:`~onceflow.priority.OnceflowPriorityPlugin` registers, does it where the metadata database
is reachable: when a run of ``article_pipeline`` or ``article_pipeline_recheck`` succeeds or
fails (``DagRun.update_state`` in the scheduler, or a state set in the UI or the REST API), the
title the run's ``extract`` committed to the ledger goes in front of the note's first line:
``<title> — <URL> — claimed from row N``. The rest of the note is kept; a note without the URL
(a run ``sheet_reconcile`` or ``recheck`` created, or one a person rewrote) gets the line
``<title> — <URL>`` on top. Writing it again changes nothing; a title that changed (the run was
cleared and the page re-read) replaces the old one.

The listener itself only reads three attributes of the run (DAG id, run id, conf) and queues
the work: the scheduler's loop never waits for it and nothing it does can raise there. One thread
per process does the rest, outside the scheduler's transaction (on SQLite a second writer in the
scheduler's own thread would wait for the scheduler's lock; the connection lookup of a hook may
commit the thread's scoped session): one indexed query on the ledger (the results of the
article's key, through :func:`onceflow.ledger.core.read_results`, on a read-only engine that
takes no write lock), then Airflow's own ``DagRunNote`` in a session of its own, written only if
the note is still what was read (a person's note sent with the state is never overwritten),
retried while the metadata database is locked or the note changed. A ledger or database error
is a warning in the log and the note stays as it was: a broken ledger never touches scheduling.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sqlalchemy.engine import Engine

    from onceflow.ledger.models import ResultRecord

log = logging.getLogger(__name__)

#: Between the title, the URL and the claim (``claim_note`` writes ``<URL> — claimed from row N``).
SEP = " — "
#: ``dag_run_note.content`` is ``VARCHAR(1000)``.
NOTE_MAX_CHARS = 1000
#: Most characters of the title in the note (the runs list has one line for it).
TITLE_CHARS = 200
#: The chain DAGs whose runs are articles: ``article_pipeline`` and its recheck lane.
CHAIN_DAG_IDS = ("article_pipeline", "article_pipeline_recheck")
#: The step whose committed result carries the page's title (and ``fetch``'s the URL).
TITLE_STEP, URL_STEP = "extract", "fetch"
#: Notes waiting for the writer; past this many (a ledger hanging for hours) new ones are dropped.
MAX_WAITING = 10_000
#: Tries of the note's write when the metadata database is busy (SQLite's lock), and the waits.
WRITE_TRIES, WRITE_BACKOFF_S = 4, 0.5


def titled_note(title: str, url: str, note: str | None) -> str | None:
    """``note`` with ``title`` in front of the line that names ``url``; ``None`` without a title,
    or when no title fits in :data:`NOTE_MAX_CHARS`.

    The title comes from a fetched page and the note is rendered as Markdown, so it is escaped
    (:func:`onceflow.articles.chain.markdown_text`): a title ``[Approve](https://evil)`` stays text.
    The line naming the URL is the note's first line when it starts with the URL (``claim_note``)
    or with an earlier title and :data:`SEP`; otherwise ``<title> — <URL>`` goes on top of the note.
    """
    from onceflow.articles.chain import markdown_text

    plain = " ".join(title.split())
    if not plain:
        return None
    head, newline, rest = (note or "").partition("\n")
    at = head.find(url) if url else -1
    ours = at == 0 or (at > 0 and head[:at].endswith(SEP))

    def compose(shown: str) -> str:
        if ours:
            return f"{shown}{SEP}{head[at:]}{newline}{rest}"
        line = f"{shown}{SEP}{url}" if url else shown
        if head == line:
            return note or line
        return f"{line}\n\n{note}" if note else line

    for limit in (TITLE_CHARS, 60, 20):
        cut = plain if len(plain) <= limit else plain[: limit - 1].rstrip() + "…"
        composed = compose(markdown_text(cut))
        if len(composed) <= NOTE_MAX_CHARS:
            return composed
    return None


def article_label(records: Iterable[ResultRecord], run_prefix: str) -> tuple[str, str] | None:
    """``(title, URL)`` of the article from its committed results, or ``None`` without a title.

    The run's own ``extract`` result first (committer ``<dag id>/<run id>/``), else the newest
    of any run (a later run of the same article replaced it: the ledger keeps one per step and
    version); the URL from the same run's ``fetch``.
    """
    from onceflow.articles.chain import run_result

    rows = list(records)
    extract = run_result(rows, TITLE_STEP, run_prefix) or max(
        (r for r in rows if r.step == TITLE_STEP), key=lambda r: r.committed_at, default=None
    )
    payload = extract.payload if extract is not None and isinstance(extract.payload, dict) else {}
    title = str(payload.get("title") or "").strip()
    if not title:
        return None
    prefix = "/".join((extract.committed_by or "").split("/")[:2]) + "/" if extract else run_prefix
    fetched = run_result(rows, URL_STEP, prefix)
    url = ""
    if fetched is not None and isinstance(fetched.payload, dict):
        url = str(fetched.payload.get("url") or "")
    return title, url


@dataclass(frozen=True)
class NoteJob:
    """What the writer needs of one ended run (read from the scheduler's object at once).

    :param url: the claim's URL from the run's conf; empty in a recheck run (``fetch`` has it).
    """

    dag_id: str
    run_id: str
    row_key: str
    recheck_key: str
    url: str

    @property
    def run_prefix(self) -> str:
        """The committer prefix of this run's ledger results."""
        return f"{self.dag_id}/{self.run_id}/"

    @property
    def work_key(self) -> str:
        """The article's ledger key: a recheck run's conf names it, a claim's has the row key."""
        from onceflow.sheets.ledger_link import work_key

        return self.recheck_key or work_key(self.row_key)


def note_job(dag_run: Any) -> NoteJob | None:
    """The job of an ended run (a few attributes, no query, no import), or ``None`` when it is not
    an article's run."""
    dag_id = str(dag_run.dag_id)
    if dag_id not in CHAIN_DAG_IDS:
        return None
    conf = dag_run.conf if isinstance(dag_run.conf, dict) else {}
    row_key, recheck_key = str(conf.get("row_key") or ""), str(conf.get("work_key") or "")
    if not (row_key or recheck_key):
        return None
    return NoteJob(dag_id, str(dag_run.run_id), row_key, recheck_key, str(conf.get("url") or ""))


class ArticleRunNotes:
    """The dag-run listener (see the module) and the one thread per process that writes notes.

    :param ledger_conn_id: the work ledger's connection.
    """

    def __init__(self, ledger_conn_id: str = "onceflow_ledger") -> None:
        self.ledger_conn_id = ledger_conn_id
        self._jobs: queue.Queue[NoteJob] = queue.Queue(maxsize=MAX_WAITING)
        self._idle = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._engine: tuple[str, Engine] | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a forked child: no writer thread, a fresh lock and queue, and the parent's ledger
        connections left to the parent (``dispose(close=False)``)."""
        self._idle = threading.Condition()
        self._jobs = queue.Queue(maxsize=MAX_WAITING)
        self._pending = 0
        self._thread = None
        if self._engine is not None:
            self._engine[1].dispose(close=False)
            self._engine = None

    # -- Airflow's listener spec (airflow/listeners/spec/dagrun.py) --------------------------------
    @hookimpl
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        """A run ended successfully: its note gets the article's title."""
        self.run_ended(dag_run)

    @hookimpl
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        """A run failed: its note gets the article's title, when ``extract`` got that far."""
        self.run_ended(dag_run)

    def run_ended(self, dag_run: Any) -> None:
        """Queue the note of an ended run; never raises."""
        try:
            job = note_job(dag_run)
            log.debug("onceflow run notes: %s ended: %s", _name(dag_run), job)
            if job is not None:
                self.submit(job)
        except Exception as exc:
            log.warning("onceflow run notes: run %s left as it is: %s", _name(dag_run), exc)

    # -- the writer ----------------------------------------------------------------------------
    def submit(self, job: NoteJob) -> None:
        """Hand ``job`` to this process's writer thread (started on first use)."""
        with self._idle:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="onceflow run notes", daemon=True)
                self._thread.start()
            try:
                self._jobs.put_nowait(job)
            except queue.Full:
                log.warning(
                    "onceflow run notes: %d notes wait; %s/%s left as it is",
                    MAX_WAITING,
                    job.dag_id,
                    job.run_id,
                )
                return
            self._pending += 1

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every queued note is written (or given up); ``False`` on timeout. For tests
        and for a process that wants its notes written before it exits."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            try:
                outcome = self.write(job)
                log.debug("onceflow run notes: %s/%s: %s", job.dag_id, job.run_id, outcome)
            except Exception as exc:  # never let the thread die: the next run's note must be written
                log.warning("onceflow run notes: %s/%s left as it is: %s", job.dag_id, job.run_id, exc)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def write(self, job: NoteJob) -> str:
        """Put the title into the run's note now; what happened (``"written"``, ``"unchanged"``,
        ``"no title"``, ``"no run"``, ``"ledger error"``). Raises only what the metadata database
        raised on the last try."""
        try:
            label = self.label(job)
        except Exception as exc:
            log.warning(
                "onceflow run notes: the ledger could not be read for %s/%s (%s: %s); its note is left as it is",
                job.dag_id, job.run_id, type(exc).__name__, exc,
            )  # fmt: skip
            return "ledger error"
        if label is None:
            return "no title"
        title, fetched_url = label
        return _retrying(lambda: _write_note(job, title, job.url or fetched_url))

    def label(self, job: NoteJob) -> tuple[str, str] | None:
        """``(title, URL)`` from the ledger: one query, on the results' unique index."""
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.ledger.core import read_results

        # the connection is looked up each time (an environment variable, or one indexed query of
        # the metadata database in this thread's own session): a changed connection takes effect
        with self._ledger_engine(LedgerHook(self.ledger_conn_id).get_url()).connect() as conn:
            records = read_results(conn, job.work_key)
        return article_label(records, job.run_prefix)

    def _ledger_engine(self, url: str) -> Engine:
        """A read-only engine on the ledger at ``url``, kept while the URL stays the same (the
        engine of a former URL is disposed: no pool left open on a ledger no longer used)."""
        from onceflow.opsview.sources import create_read_engine

        if self._engine is None or self._engine[0] != url:
            if self._engine is not None:
                self._engine[1].dispose()
            self._engine = (url, create_read_engine(url))
        return self._engine[1]


class NoteChanged(RuntimeError):
    """The note changed between our read and our write (a person edited it, e.g. with the state in
    the same request): read it again."""


def _write_note(job: NoteJob, title: str, url: str) -> str:
    """Read the run's note, put the title in, and write it only if the note is still what was
    read (compare and set, one transaction): a note written meanwhile is never overwritten.

    :raises NoteChanged: it was not (the caller reads it again).
    """
    from airflow.models.dagrun import DagRun, DagRunNote
    from airflow.utils.session import create_session
    from sqlalchemy import select, update

    with create_session(scoped=False) as session:
        run_pk = session.scalar(
            select(DagRun.id).where(DagRun.dag_id == job.dag_id, DagRun.run_id == job.run_id)
        )
        if run_pk is None:  # deleted since it ended
            return "no run"
        found = session.execute(select(DagRunNote.content).where(DagRunNote.dag_run_id == run_pk)).first()
        old = found[0] if found is not None else None
        new = titled_note(title, url, old)
        if new is None or new == old:
            return "unchanged"
        if found is None:
            note = DagRunNote(content=new)
            note.dag_run_id = run_pk
            session.add(note)
            session.flush()  # a note inserted meanwhile: IntegrityError, read again
        else:
            same = DagRunNote.content.is_(None) if old is None else DagRunNote.content == old
            done = session.execute(
                update(DagRunNote)
                .where(DagRunNote.dag_run_id == run_pk, same)
                .values(content=new)
                .execution_options(synchronize_session=False)
            )
            if getattr(done, "rowcount", 1) != 1:
                raise NoteChanged(f"{job.dag_id}/{job.run_id}")
    log.info("onceflow run notes: %s/%s: %s", job.dag_id, job.run_id, new.partition("\n")[0])
    return "written"


def _retrying(write: Callable[[], str]) -> str:
    """``write()``, again after a pause while the metadata database is locked (SQLite's one
    writer) or the note changed under it (:class:`NoteChanged`, or a note inserted meanwhile)."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(1, WRITE_TRIES + 1):
        try:
            return write()
        except (OperationalError, IntegrityError, NoteChanged) as exc:
            busy = not isinstance(exc, OperationalError) or "locked" in str(exc).lower()
            if attempt == WRITE_TRIES or not busy:
                raise
            time.sleep(WRITE_BACKOFF_S * attempt)
    raise AssertionError("unreachable")


def _name(dag_run: Any) -> str:
    try:
        return f"{dag_run.dag_id}/{dag_run.run_id}"
    except Exception:
        return repr(dag_run)


#: The instance :class:`~onceflow.priority.OnceflowPriorityPlugin` lists in ``listeners``.
RUN_NOTES = ArticleRunNotes()
