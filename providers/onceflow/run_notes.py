"""The article's title in its run's note, written from the scheduler when the run ends.

``sheet_claim`` creates each ``article_pipeline`` run with the note ``<URL> — claimed from row N``
(:func:`onceflow.operators.sheets.claim_note`); the article's title is known only once ``extract``
has read the page, and Airflow's Task SDK gives a running task no way to change its run's note
(the Execution API has none in 3.1-3.3). So :class:`ArticleRunNotes`, a dag-run listener that
:class:`~onceflow.priority.OnceflowPriorityPlugin` registers, does it where the metadata database
is reachable: when a run of ``article_pipeline`` or ``article_pipeline_recheck`` succeeds or
fails (``DagRun.update_state`` in the scheduler, or a state set in the UI or the REST API), the
title the run's own ``extract`` committed to the ledger goes into the note:
``<title> — <URL> — claimed from row N``.

Only a first line this module can prove it wrote is rewritten (:func:`titled_note`): the claim's
line, or one of the lines it writes, with a Markdown-escaped title, in a note no person wrote
(``dag_run_note.user_id`` is empty). Any other note, a person's above all, is kept whole under a
``<title> — <URL>`` line on top. Writing it again changes nothing; a title that changed (the run
was cleared and the page re-read) replaces the old one in a note no person wrote.

The listener itself only reads three attributes of the run (DAG id, run id, conf) and queues
the work: the scheduler's loop never waits for it and nothing it does can raise there. One thread
per process does the rest, about a second later (:data:`JOB_DELAY_S`: Airflow 3.1 and 3.2 call
the listener of a PATCH before they apply the PATCH's note), outside the scheduler's transaction
(on SQLite a second writer in the scheduler's own thread would wait for the scheduler's lock; the
connection lookup of a hook may commit the thread's scoped session): one indexed query on the
ledger (the results of the article's key, through :func:`onceflow.ledger.core.read_results`, on a
read-only engine that takes no write lock and whose PostgreSQL connections give up within
seconds), then Airflow's own ``DagRunNote`` in a session of its own, written only if the note is
still what was read (a person's note sent with the state is never overwritten), retried while
the metadata database is locked or the note changed. A ledger or database error is a warning in
the log and the job is tried again later (:data:`RETRY_DELAYS_S`), then given up; the note stays
as it was: a broken ledger never touches scheduling. At exit the process gives its queued notes a
few seconds (:data:`EXIT_WAIT_S`), and when its writer starts it queues the runs that ended in the
day before the process started and still have no title (:data:`SWEEP_HOURS`,
:data:`SWEEP_MAX_RUNS`): a scheduler restarted titles what the stopped one missed.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import itertools
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

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
#: A job waits this long after it is queued. Airflow 3.1 and 3.2 apply a PATCH's state (and call
#: the listener) before its note, in one transaction: a note inserted in that window would make
#: the person's PATCH fail on ``dag_run_note``'s primary key.
JOB_DELAY_S = 1.0
#: A job whose ledger (or metadata database) could not be read is tried again after these waits,
#: then given up (a ledger restarting or failing over comes back within minutes).
RETRY_DELAYS_S = (10.0, 60.0, 300.0)
#: At exit, how long the process waits for the notes due by then (the writer is a daemon thread).
EXIT_WAIT_S = 5.0
#: When its writer starts, a process queues the runs that ended in this many hours before it
#: started and whose note has no title, the newest :data:`SWEEP_MAX_RUNS` of them.
SWEEP_HOURS, SWEEP_MAX_RUNS = 24, 300
#: The writer thread's name.
WRITER_THREAD = "onceflow run notes"
#: How the read-only ledger engine's connections show in PostgreSQL's ``pg_stat_activity``.
APPLICATION_NAME = "onceflow-run-notes"

#: The tail of ``claim_note``'s line after the URL (:func:`onceflow.operators.sheets.claim_note`).
_CLAIM_TAIL = re.compile(r" — claimed from row \d+")
#: A title as :func:`onceflow.articles.chain.markdown_text` writes it: every ASCII punctuation
#: character escaped with a backslash.
_ESCAPED = re.compile(r"(?:\\[!-/:-@\[-`{-~]|[^!-/:-@\[-`{-~])+")


def titled_note(title: str, url: str, note: str | None, *, by_person: bool = False) -> str | None:
    """``note`` with ``title`` in it; ``None`` without a title, or when no title fits in
    :data:`NOTE_MAX_CHARS`.

    The title comes from a fetched page and the note is rendered as Markdown, so it is escaped
    (:func:`onceflow.articles.chain.markdown_text`): a title ``[Approve](https://evil)`` stays text.
    Where it goes depends on the note's first line:

    - the claim's line with no title (``<URL> — claimed from row N``, or the URL alone, the claim
      note before titles): the title goes in front, nothing is removed;
    - a line this module wrote (``<title> — <URL> — claimed from row N``, ``<title> — <URL>``, or
      when no URL is known ``<title>`` above a blank line) with the same title: unchanged; with
      another title that is provably ours (escaped as this module escapes, in a note no person
      wrote, ``by_person`` false): the new title replaces it;
    - anything else (a person's text, even one that ends with the URL): ``<title> — <URL>`` goes
      on top, a blank line, then the whole note.

    :param by_person: a person wrote the note (``dag_run_note.user_id`` is set): no title in it is
        provably ours, none is replaced.
    """
    from onceflow.articles.chain import markdown_text

    plain = " ".join(title.split())
    if not plain:
        return None
    for limit in (TITLE_CHARS, 60, 20):
        cut = plain if len(plain) <= limit else plain[: limit - 1].rstrip() + "…"
        composed = _compose(markdown_text(cut), url, note or "", by_person)
        if len(composed) <= NOTE_MAX_CHARS:
            return composed
    return None


def _compose(shown: str, url: str, note: str, by_person: bool) -> str:
    line = f"{shown}{SEP}{url}" if url else shown
    if not note:
        return line
    head, newline, rest = note.partition("\n")
    if untitled_head(head, url):
        return f"{shown}{SEP}{head}{newline}{rest}"
    if head == line:
        return note
    found = _titled_head(head, url, rest)
    if found is not None:
        old, tail = found
        if old == shown:
            return note
        if not by_person and _escaped_title(old):
            return f"{shown}{SEP}{tail}{newline}{rest}" if tail else f"{shown}{newline}{rest}"
    return f"{line}\n\n{note}"


def untitled_head(head: str, url: str) -> bool:
    """Whether ``head`` (a note's first line) is a claim's line without a title: ``claim_note``'s
    ``<URL> — claimed from row N``, or the URL alone (the claim note before titles,
    ``<URL>\\n\\nClaimed from row N of the article queue sheet.``)."""
    if not url or not head.startswith(url):
        return False
    return head == url or _CLAIM_TAIL.fullmatch(head, len(url)) is not None


def _titled_head(head: str, url: str, rest: str) -> tuple[str, str] | None:
    """``(title, tail)`` of a first line of the shape this module writes, ``<title> — <URL>`` or
    ``<title> — <URL> — claimed from row N`` (``tail``: from the URL on). When no URL is known,
    ``(head, "")`` when a blank line follows it (``<title>`` on top of an older note; a line alone
    may be anyone's). Whether the title is ours is for the caller to judge."""
    if not url:
        return (head, "") if head and rest.startswith("\n") else None
    at = head.find(SEP + url)
    if at <= 0 or not untitled_head(head[at + len(SEP) :], url):
        return None
    return head[:at], head[at + len(SEP) :]


def _escaped_title(text: str) -> bool:
    """Whether ``text`` can be a title as :func:`titled_note` writes it: one line, single spaces,
    every ASCII punctuation character backslash-escaped. A person's words before the URL
    (``NOT THIS ONE, see row 9: ...``) almost always carry some unescaped punctuation."""
    return text == " ".join(text.split()) and _ESCAPED.fullmatch(text) is not None


def article_label(records: Iterable[ResultRecord], run_prefix: str) -> tuple[str, str] | None:
    """``(title, URL)`` of the article from this run's own committed results, or ``None`` when
    the run committed no ``extract`` with a title (it ended before ``extract``, or a later run of
    the article replaced its results: the ledger keeps one per step and version).

    Only the run's own ``extract`` (committer ``<dag id>/<run id>/``) counts: a run that failed
    before reading the page is not named after what another run read. The URL is from the same
    run's ``fetch``.
    """
    from onceflow.articles.chain import run_result

    rows = list(records)
    extract = run_result(rows, TITLE_STEP, run_prefix)
    payload = extract.payload if extract is not None and isinstance(extract.payload, dict) else {}
    title = str(payload.get("title") or "").strip()
    if not title:
        return None
    fetched = run_result(rows, URL_STEP, run_prefix)
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
    def key(self) -> tuple[str, str]:
        """The run: DAG id and run id."""
        return self.dag_id, self.run_id

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
    an article's run. ``dag_run`` is a ``DagRun`` or any row with ``dag_id``, ``run_id``, ``conf``."""
    dag_id = str(dag_run.dag_id)
    if dag_id not in CHAIN_DAG_IDS:
        return None
    conf = dag_run.conf if isinstance(dag_run.conf, dict) else {}
    row_key, recheck_key = str(conf.get("row_key") or ""), str(conf.get("work_key") or "")
    if not (row_key or recheck_key):
        return None
    return NoteJob(dag_id, str(dag_run.run_id), row_key, recheck_key, str(conf.get("url") or ""))


@dataclass(order=True)
class _Due:
    """A queued job: when it is due (``time.monotonic``), and how many tries it has had."""

    at: float
    seq: int
    job: NoteJob = field(compare=False)
    tries: int = field(compare=False, default=0)


class LedgerUnreadable(RuntimeError):
    """The ledger could not be read for a job (connection lookup, connect, query)."""


class ArticleRunNotes:
    """The dag-run listener (see the module) and the one thread per process that writes notes.

    :param ledger_conn_id: the work ledger's connection.
    :param delay_s: how long a job waits after it is queued (:data:`JOB_DELAY_S`).
    :param retry_delays: the waits before the tries after a ledger or database error
        (:data:`RETRY_DELAYS_S`); their number bounds the tries.
    :param exit_wait_s: how long the process's exit waits for the notes due by then.
    """

    def __init__(
        self,
        ledger_conn_id: str = "onceflow_ledger",
        *,
        delay_s: float = JOB_DELAY_S,
        retry_delays: Sequence[float] = RETRY_DELAYS_S,
        exit_wait_s: float = EXIT_WAIT_S,
    ) -> None:
        self.ledger_conn_id = ledger_conn_id
        self.delay_s = delay_s
        self.retry_delays = tuple(retry_delays)
        self.exit_wait_s = exit_wait_s
        #: The catch-up looks at runs that ended before this (about when the process started).
        self.started_at = datetime.now(UTC)
        self._engine: tuple[str, Engine] | None = None
        self._reset()
        os.register_at_fork(after_in_child=self._forked)
        atexit.register(self._at_exit)

    def _reset(self) -> None:
        self._lock = threading.Condition()
        self._due: list[_Due] = []  # a heap, earliest first
        self._waiting: set[tuple[str, str]] = set()  # the runs in _due
        self._pending = 0  # jobs in _due and the one being written
        self._writing: tuple[str, str] | None = None  # the run whose job is being written
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._swept = False

    def _forked(self) -> None:
        """In a forked child: no writer thread, a fresh lock and queue, and the parent's ledger
        connections left to the parent (``dispose(close=False)``)."""
        self._reset()
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

    # -- the queue -----------------------------------------------------------------------------
    def submit(self, job: NoteJob) -> bool:
        """Queue ``job`` for this process's writer thread, due in :attr:`delay_s`; the thread is
        started (again) when it is not running. ``False`` when the queue is full."""
        queued = self._push(job, self.delay_s)
        with self._lock:
            try:
                self._ensure_writer()
            except Exception as exc:  # no thread can be started now: the next job tries again
                log.warning(
                    "onceflow run notes: the writer thread could not start (%s); %d notes wait for the next run's end",
                    exc, len(self._due),
                )  # fmt: skip
        return queued

    def _push(self, job: NoteJob, delay: float, tries: int = 0) -> bool:
        with self._lock:
            if job.key in self._waiting:  # it is due anyway, and reads the note and ledger then
                return True
            if len(self._due) >= MAX_WAITING:
                log.warning(
                    "onceflow run notes: %d notes wait; %s/%s left as it is",
                    MAX_WAITING,
                    job.dag_id,
                    job.run_id,
                )
                return False
            heapq.heappush(self._due, _Due(time.monotonic() + delay, next(self._seq), job, tries))
            self._waiting.add(job.key)
            self._pending += 1
            self._lock.notify_all()
            return True

    def _ensure_writer(self) -> None:
        """Start the writer thread unless it is alive (called holding the lock). ``_thread`` is
        set only once the thread started: a start that failed is tried again by the next job."""
        if self._thread is not None and self._thread.is_alive():
            return
        thread = threading.Thread(target=self._work, name=WRITER_THREAD, daemon=True)
        thread.start()
        self._thread = thread

    def wait_idle(self, timeout: float = 30.0, runs: Iterable[tuple[str, str]] | None = None) -> bool:
        """Wait until every queued note is written or given up, tries after an error included;
        ``False`` on timeout. For tests, and for a process that wants its notes written.

        :param runs: only these runs' notes (``(dag_id, run_id)``): other jobs in the queue, such
            as an earlier run's tries against a ledger that has gone, are not waited for.
        """
        if runs is None:
            with self._lock:
                return self._lock.wait_for(lambda: self._pending == 0, timeout)
        wanted = set(runs)

        def done() -> bool:
            return self._writing not in wanted and wanted.isdisjoint(self._waiting)

        with self._lock:
            return self._lock.wait_for(done, timeout)

    def _at_exit(self) -> None:
        """At the interpreter's exit (``atexit``; the writer is a daemon thread that would die
        mid-queue): wait up to :attr:`exit_wait_s` for the notes due by then. Never raises."""
        try:
            with self._lock:
                if not self._pending or self._thread is None or not self._thread.is_alive():
                    return
                deadline = time.monotonic() + self.exit_wait_s

                def done() -> bool:
                    writing = self._pending - len(self._due)
                    return writing == 0 and all(d.at > deadline for d in self._due)

                self._lock.wait_for(done, self.exit_wait_s)
                left = self._pending
            if left:
                log.warning(
                    "onceflow run notes: %d notes not written at exit; the next scheduler's catch-up titles them",
                    left,
                )
        except Exception:  # an exit must not fail on a note
            pass

    # -- the writer ----------------------------------------------------------------------------
    def _work(self) -> None:
        if not self._swept:
            self._swept = True
            self.catch_up()
        while True:
            item = self._next()
            try:
                self._attempt(item)
            except BaseException:  # the thread ends (SystemExit, ...): the next job starts another
                with self._lock:
                    self._thread = None
                    self._pending -= 1
                    self._writing = None
                    self._lock.notify_all()
                    if self._due:  # queued while this one was ending
                        with contextlib.suppress(Exception):
                            self._ensure_writer()
                raise
            with self._lock:
                self._pending -= 1
                self._writing = None
                self._lock.notify_all()

    def _next(self) -> _Due:
        """The earliest job, once it is due."""
        with self._lock:
            while True:
                if not self._due:
                    self._lock.wait()
                    continue
                wait = self._due[0].at - time.monotonic()
                if wait <= 0:
                    item = heapq.heappop(self._due)
                    self._waiting.discard(item.job.key)
                    self._writing = item.job.key
                    return item
                self._lock.wait(wait)

    def _attempt(self, item: _Due) -> str:
        """One try of ``item``'s job; after an error it is queued again (:attr:`retry_delays`)
        or given up, with a warning either way. Never raises an ``Exception``."""
        job = item.job
        try:
            outcome = self.write(job)
        except Exception as exc:
            if isinstance(exc, LedgerUnreadable):
                cause = exc.__cause__ or exc
                what = f"the ledger could not be read for {job.dag_id}/{job.run_id}"
            else:
                cause = exc
                what = f"the note of {job.dag_id}/{job.run_id} could not be written"
            if item.tries < len(self.retry_delays):
                delay = self.retry_delays[item.tries]
                log.warning(
                    "onceflow run notes: %s (%s: %s); trying again in %g s",
                    what, type(cause).__name__, cause, delay,
                )  # fmt: skip
                self._push(job, delay, item.tries + 1)
            else:
                log.warning(
                    "onceflow run notes: %s (%s: %s) after %d tries; its note is left as it is",
                    what, type(cause).__name__, cause, item.tries + 1,
                )  # fmt: skip
            return "ledger error" if isinstance(exc, LedgerUnreadable) else "error"
        log.debug("onceflow run notes: %s/%s: %s", job.dag_id, job.run_id, outcome)
        return outcome

    def write(self, job: NoteJob) -> str:
        """Put the title into the run's note now; what happened (``"written"``, ``"unchanged"``,
        ``"no title"``, ``"no run"``).

        :raises LedgerUnreadable: the ledger could not be read.
        :raises sqlalchemy.exc.SQLAlchemyError: what the metadata database raised on the last try.
        """
        try:
            label = self.label(job)
        except Exception as exc:
            raise LedgerUnreadable(str(exc)) from exc
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
        engine of a former URL is disposed: no pool left open on a ledger no longer used). On
        PostgreSQL its connections give up within seconds on a database that does not answer
        (:func:`onceflow.opsview.sources.create_read_engine`)."""
        from onceflow.opsview.sources import create_read_engine

        if self._engine is None or self._engine[0] != url:
            if self._engine is not None:
                self._engine[1].dispose()
            self._engine = (url, create_read_engine(url, application_name=APPLICATION_NAME))
        return self._engine[1]

    # -- the catch-up --------------------------------------------------------------------------
    def catch_up(self) -> int:
        """Queue the runs that ended in the :data:`SWEEP_HOURS` before this process started whose
        note still has no title (at most :data:`SWEEP_MAX_RUNS`, the newest): the notes a stopped
        scheduler did not write. Runs that ended since went through this process's listener.
        The writer does it when it starts; one query of the metadata database. Never raises;
        how many runs were queued."""
        try:
            jobs = untitled_runs(self.started_at - timedelta(hours=SWEEP_HOURS), self.started_at)
        except Exception as exc:
            log.warning("onceflow run notes: the runs ended before this process could not be read: %s", exc)
            return 0
        queued = sum(self._push(job, self.delay_s) for job in jobs)
        if queued:
            log.info("onceflow run notes: %d runs that ended before this process have no title yet", queued)
        return queued


def untitled_runs(since: datetime, until: datetime) -> list[NoteJob]:
    """The jobs of article runs that ended in ``[since, until)`` (the newest :data:`SWEEP_MAX_RUNS`)
    and whose note has no title: none at all, or a claim's line without one."""
    from airflow.models.dagrun import DagRun, DagRunNote
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import select

    with create_session(scoped=False) as session:
        rows = session.execute(
            select(DagRun.dag_id, DagRun.run_id, DagRun.conf, DagRunNote.content)
            .outerjoin(DagRunNote, DagRunNote.dag_run_id == DagRun.id)
            .where(
                DagRun.dag_id.in_(CHAIN_DAG_IDS),
                DagRun.state.in_((DagRunState.SUCCESS, DagRunState.FAILED)),
                DagRun.end_date >= since,
                DagRun.end_date < until,
            )
            .order_by(DagRun.end_date.desc())
            .limit(SWEEP_MAX_RUNS)
        ).all()
    jobs = []
    for row in rows:
        job = note_job(row)
        if job is not None and (not row.content or untitled_head(row.content.partition("\n")[0], job.url)):
            jobs.append(job)
    return jobs


class NoteChanged(RuntimeError):
    """The note changed between our read and our write (a person edited it, e.g. with the state in
    the same request): read it again."""


def _write_note(job: NoteJob, title: str, url: str) -> str:
    """Read the run's note and who wrote it, put the title in, and write it only if the note is
    still what was read (compare and set, one transaction): a note written meanwhile is never
    overwritten.

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
        found = session.execute(
            select(DagRunNote.content, DagRunNote.user_id).where(DagRunNote.dag_run_id == run_pk)
        ).first()
        old, user = (found[0], found[1]) if found is not None else (None, None)
        new = titled_note(title, url, old, by_person=user is not None)
        if new is None or new == old:
            return "unchanged"
        if found is None:
            note = DagRunNote(content=new)
            note.dag_run_id = run_pk
            session.add(note)
            session.flush()  # a note inserted meanwhile: IntegrityError, read again
        else:
            same = DagRunNote.content.is_(None) if old is None else DagRunNote.content == old
            same_user = DagRunNote.user_id.is_(None) if user is None else DagRunNote.user_id == user
            done = session.execute(
                update(DagRunNote)
                .where(DagRunNote.dag_run_id == run_pk, same, same_user)
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
