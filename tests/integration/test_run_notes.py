"""The article's title in its run's note (``onceflow.run_notes``), against the real metadata DB.

The listener is reached the way Airflow reaches it: through Airflow's own listener manager (which
loads it from onceflow's plugin), with a real ``dag_run`` row, or from ``dag.test()`` (3.3.2's
``dag.test`` calls ``DagRun.update_state``, which calls the dag-run listeners, as the scheduler
does). The ledger is real (SQLite file and PostgreSQL); notes are read back with plain SQL.
The whole chain's note, from a real ``extract``, is checked in ``test_article_chain.py`` and,
under a real scheduler, in ``tests/acceptance/test_article_chain_cluster.py``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import sqlalchemy as sa

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.operators.sheets import claim_note
from onceflow.run_notes import APPLICATION_NAME, RUN_NOTES, WRITER_THREAD, ArticleRunNotes, NoteJob, note_job
from onceflow.sheets.keys import article_run_conf, normalise_url, pipeline_run_id, row_key
from onceflow.sheets.ledger_link import work_key

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

CHAIN = "article_pipeline"


def point_ledger(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """``onceflow_ledger`` (as every process sees it: the environment) pointed at ``url``."""
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))


@pytest.fixture
def article_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """``onceflow_ledger`` pointed at a fresh ledger (SQLite file or PostgreSQL database)."""
    point_ledger(monkeypatch, ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


def break_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``onceflow_ledger`` pointed at a file that is not a database."""
    path = tmp_path / "broken-ledger.db"
    path.write_bytes(b"this is not an SQLite database, " * 64)
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return path


@pytest.fixture
def broken_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``onceflow_ledger`` broken, and the listener's tries after an error a moment apart (the
    real waits are minutes)."""
    monkeypatch.setattr(RUN_NOTES, "retry_delays", (0.1,))
    return break_ledger(tmp_path, monkeypatch)


@pytest.fixture
def writer_sql() -> Iterator[list[tuple[str, threading.Event]]]:
    """Watch the note writer's statements on the metadata database: append ``(start, event)``
    and the event is set once the writer thread has run a statement starting with ``start``."""
    from airflow import settings

    watches: list[tuple[str, threading.Event]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.current_thread().name == WRITER_THREAD:
            for start, event in watches:
                if " ".join(statement.split()).startswith(start):
                    event.set()

    sa.event.listen(settings.engine, "after_cursor_execute", seen)
    try:
        yield watches
    finally:
        sa.event.remove(settings.engine, "after_cursor_execute", seen)


def watch(watches: list[tuple[str, threading.Event]], start: str) -> threading.Event:
    event = threading.Event()
    watches.append((start, event))
    return event


def article(url: str) -> tuple[str, dict[str, str], str]:
    """Run id, run conf and ledger key of the claimed row of ``url``."""
    key = row_key(normalise_url(url))
    conf = article_run_conf(
        token=uuid.uuid4().hex[:12], key=key, url=url, spreadsheet_id="sheet", sheet="queue", version="v1"
    )
    return pipeline_run_id(key, "v1"), conf, work_key(key)


def add_run(
    run_id: str,
    conf: dict[str, str],
    note: str | None,
    state: str = "success",
    *,
    by: str | None = None,
    ended: datetime | None = None,
) -> None:
    """A real ``dag_run`` row (and its ``dag_run_note``), as ``sheet_claim`` left it, now ended.

    :param by: the note's ``user_id`` (a person wrote it in the UI or the REST API).
    :param ended: the run's ``end_date``.
    """
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    run = DagRun(
        dag_id=CHAIN,
        run_id=run_id,
        run_type=DagRunType.MANUAL,
        conf=conf,
        state=state,
        note=(note, by) if note is not None else None,
    )
    run.end_date = ended
    with create_session() as session:
        session.add(run)


def delete_runs(*run_ids: str) -> None:
    """Delete runs and their notes (runs that ended "an hour ago" must not reach the catch-up of
    writers started later in this test session)."""
    from airflow.models.dagrun import DagRun, DagRunNote
    from airflow.utils.session import create_session

    with create_session() as session:
        ids = session.scalars(
            sa.select(DagRun.id).where(DagRun.dag_id == CHAIN, DagRun.run_id.in_(run_ids))
        ).all()
        session.execute(sa.delete(DagRunNote).where(DagRunNote.dag_run_id.in_(ids)))
        session.execute(sa.delete(DagRun).where(DagRun.id.in_(ids)))


def job_of(run_id: str) -> NoteJob:
    """The listener's job for the run, from its real row."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalars(sa.select(DagRun).where(DagRun.dag_id == CHAIN, DagRun.run_id == run_id)).one()
        job = note_job(run)
    assert job is not None
    return job


def end_run(run_id: str, *, wait: bool = True) -> None:
    """Call the dag-run listeners of the ended run as ``DagRun.update_state`` does, through
    Airflow's listener manager (so through onceflow's plugin), and wait for the note's writer."""
    from airflow.listeners.listener import get_listener_manager
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalars(sa.select(DagRun).where(DagRun.dag_id == CHAIN, DagRun.run_id == run_id)).one()
        hook = get_listener_manager().hook
        if run.state == "success":
            hook.on_dag_run_success(dag_run=run, msg="success")
        else:
            hook.on_dag_run_failed(dag_run=run, msg="task_failure")
    if wait:
        assert RUN_NOTES.wait_idle(30, runs=[(CHAIN, run_id)]), "the note writer did not finish"


def stored(run_id: str, dag_id: str = CHAIN) -> tuple[str | None, str]:
    """The run's note and state, read with plain SQL from the metadata database."""
    from airflow import settings

    with settings.engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT n.content, r.state FROM dag_run r LEFT JOIN dag_run_note n ON n.dag_run_id = r.id "
                "WHERE r.dag_id = :d AND r.run_id = :r"
            ),
            {"d": dag_id, "r": run_id},
        ).one()
    return row[0], row[1]


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether ``check()`` comes true within ``timeout`` seconds (looked at every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def commit_steps(ledger: Ledger, key: str, run_id: str, results: dict[str, dict[str, Any]]) -> None:
    """Commit ``results`` (step -> payload) as the run's tasks commit them, one lease per step."""
    for step, payload in results.items():
        lease = ledger.lease_key(
            "article", key, f"{CHAIN}/{run_id}/1/{step}", 60, "v1", reopen_reason="the next step"
        )
        ledger.commit_result(lease, step, payload)


def test_an_ended_article_run_gets_its_title_in_front_of_the_claim_note(
    airflow_db: object, article_ledger: Ledger
) -> None:
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/huertos"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 3))
    commit_steps(
        article_ledger,
        key,
        run_id,
        {
            "fetch": {"url": url, "status": 200},
            "extract": {"language": "es", "title": "Los huertos [urbanos]"},
        },
    )

    end_run(run_id)

    # the title (escaped: the note is Markdown, the title from a page), the claim note kept
    titled = f"Los huertos \\[urbanos\\] — {url} — claimed from row 3"
    assert stored(run_id) == (titled, "success")
    end_run(run_id)  # a second call (the UI marks the run success again) changes nothing
    assert stored(run_id) == (titled, "success")

    # the run is cleared and the page re-read: the new title replaces the old one
    commit_steps(article_ledger, key, run_id, {"extract": {"language": "es", "title": "Huertos en 2026"}})
    end_run(run_id)
    assert stored(run_id) == (f"Huertos en 2026 — {url} — claimed from row 3", "success")


def test_a_note_without_the_url_keeps_its_text_under_the_title_line_and_a_failed_run_is_titled(
    airflow_db: object, article_ledger: Ledger
) -> None:
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/cafe"
    run_id, conf, key = article(url)
    add_run(run_id, conf, "Ana: the sheet had a typo here", state="failed")
    commit_steps(
        article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Historia del café"}}
    )

    end_run(run_id)

    assert stored(run_id) == (f"Historia del café — {url}\n\nAna: the sheet had a typo here", "failed")


def test_a_note_a_person_writes_while_the_title_goes_in_is_kept(
    airflow_db: object, article_ledger: Ledger, writer_sql: list[tuple[str, threading.Event]]
) -> None:
    """The UI's "mark as" dialog sends a note with the state: the listener's writer reads the note
    before that request commits and must not write its own over it (compare and set). The edit
    commits only once the writer has read the note (whatever the machine's load), so without the
    compare and set the writer's update would overwrite it."""
    from airflow import settings

    url = f"https://news.example/{uuid.uuid4().hex[:8]}/gazpacho"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 2))
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Gazpacho"}})
    read = watch(writer_sql, "SELECT dag_run_note.content")
    edited = "Ana: the row moved to the archive tab"
    with settings.engine.connect() as conn:
        edit = conn.begin()
        conn.execute(
            sa.text(
                "UPDATE dag_run_note SET content = :c, user_id = 'ana' WHERE dag_run_id = "
                "(SELECT id FROM dag_run WHERE dag_id = :d AND run_id = :r)"
            ),
            {"c": edited, "d": CHAIN, "r": run_id},
        )
        end_run(run_id, wait=False)  # the writer reads the claim note, then waits for the edit's lock
        assert read.wait(30), "the writer did not read the note"
        edit.commit()
    assert RUN_NOTES.wait_idle(30, runs=[(CHAIN, run_id)])

    assert stored(run_id) == (f"Gazpacho — {url}\n\n{edited}", "success")


def test_a_note_sent_with_the_state_is_not_beaten_by_the_writer(
    airflow_db: object, article_ledger: Ledger, writer_sql: list[tuple[str, threading.Event]]
) -> None:
    """Airflow 3.1 and 3.2 apply a PATCH's state (calling the listener) before its note, in the
    same request: a run without a note gets the person's note an instant after the listener was
    called. The writer waits about a second, so its own note is not inserted first (which made
    the person's PATCH fail on ``dag_run_note``'s primary key)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    url = f"https://news.example/{uuid.uuid4().hex[:8]}/paella"
    run_id, conf, key = article(url)
    add_run(run_id, conf, None)  # a recheck's run, or a note a person cleared
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Paella"}})
    inserted = watch(writer_sql, "INSERT INTO dag_run_note")

    called = time.monotonic()
    end_run(run_id, wait=False)  # the PATCH's state, and the listener
    inserted.wait(max(0.0, called + 0.6 - time.monotonic()))  # what the request does meanwhile
    with create_session() as session:  # the PATCH's note, as Airflow's patch_dag_run_note sets it
        run = session.scalars(sa.select(DagRun).where(DagRun.dag_id == CHAIN, DagRun.run_id == run_id)).one()
        run.note = ("Ana: the Valencian one", "ana")
    assert RUN_NOTES.wait_idle(30, runs=[(CHAIN, run_id)])

    assert stored(run_id) == (f"Paella — {url}\n\nAna: the Valencian one", "success")


def test_a_persons_words_before_the_url_are_kept_and_only_our_own_line_is_retitled(
    airflow_db: object, article_ledger: Ledger
) -> None:
    """A first line of our shape is rewritten only in a note no person wrote (``user_id`` empty);
    a person's is kept whole under the title line, whatever it looks like."""
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/tortilla"
    typed = f"Wrong one — {url} — claimed from row 3"
    person, ours = article(url), article(url + "?v=2")
    add_run(person[0], person[1], typed, by="ana")
    add_run(ours[0], ours[1], f"Tortilla vieja — {url}?v=2 — claimed from row 4")
    for run_id, _, key in (person, ours):
        commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Tortilla"}})

    end_run(person[0])
    end_run(ours[0])

    assert stored(person[0]) == (f"Tortilla — {url}\n\n{typed}", "success")
    assert stored(ours[0]) == (f"Tortilla — {url}?v=2 — claimed from row 4", "success")


def test_a_run_that_ended_before_extract_and_other_dags_runs_are_left_alone(
    airflow_db: object, article_ledger: Ledger
) -> None:
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/gone"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 5), state="failed")
    # an earlier run of the article read the page; this one ended before extract (a 404 now):
    # it is not named after what the other run read
    commit_steps(article_ledger, key, "earlier", {"fetch": {"url": url}, "extract": {"title": "Leído antes"}})
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}})

    end_run(run_id)

    assert stored(run_id) == (claim_note(url, 5), "failed")


def test_a_ledger_error_leaves_the_run_and_its_note_as_they_were_with_a_warning(
    airflow_db: object, broken_ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/broken"
    run_id, conf, _ = article(url)
    add_run(run_id, conf, claim_note(url, 4))
    caplog.set_level(logging.WARNING, logger="onceflow.run_notes")

    end_run(run_id)  # tried, tried again (retry_delays), given up

    assert stored(run_id) == (claim_note(url, 4), "success")
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "onceflow.run_notes" and run_id in r.getMessage()
    ]
    assert len(warnings) == 2, warnings
    assert all("ledger could not be read" in m for m in warnings)
    assert "trying again in 0.1 s" in warnings[0] and "its note is left as it is" in warnings[1]


def test_a_ledger_error_is_tried_again_later(
    airflow_db: object,
    article_ledger: Ledger,
    ledger_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ledger down when the run ends (restarting, failing over) is read again a while later."""
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/later"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 6))
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Más tarde"}})
    caplog.set_level(logging.WARNING, logger="onceflow.run_notes")
    notes = ArticleRunNotes(retry_delays=(2.0,))
    break_ledger(tmp_path, monkeypatch)

    notes.submit(job_of(run_id))
    assert eventually(
        lambda: any(run_id in r.getMessage() and "trying again" in r.getMessage() for r in caplog.records)
    )
    point_ledger(monkeypatch, ledger_url)  # the ledger is back before the next try
    assert notes.wait_idle(30)

    assert stored(run_id) == (f"Más tarde — {claim_note(url, 6)}", "success")


def test_dag_test_calls_the_listener_and_a_broken_ledger_does_not_fail_the_run(
    run_dag: Any, broken_ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``dag.test()`` ends the run through ``DagRun.update_state``: the listener is called there,
    meets a broken ledger, warns, and the run is successful with no note (every task is marked
    success without running, so nothing else reads the ledger)."""
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/dagtest"
    _, conf, _ = article(url)
    caplog.set_level(logging.WARNING, logger="onceflow.run_notes")

    run = run_dag(CHAIN, conf=conf, mark_success_pattern=".*")
    assert RUN_NOTES.wait_idle(30, runs=[(CHAIN, run.run_id)])

    assert run.state == "success"
    assert stored(run.run_id) == (None, "success")
    messages = [r.getMessage() for r in caplog.records if r.name == "onceflow.run_notes"]
    assert any("ledger could not be read" in m and run.run_id in m for m in messages), messages


def test_a_ledger_that_never_answers_is_an_error_within_seconds(
    airflow_db: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A PostgreSQL ledger whose address takes the connection and never answers (a black hole past
    the handshake) used to hold the writer, and every note behind it, for as long as the socket
    lived; the listener's engine gives up on connecting within seconds (``connect_timeout``)."""
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel completes the handshake; no reply
    try:
        point_ledger(
            monkeypatch, f"postgresql+psycopg2://onceflow@127.0.0.1:{silent.getsockname()[1]}/ledger"
        )
        url = f"https://news.example/{uuid.uuid4().hex[:8]}/silent"
        run_id, conf, _ = article(url)
        add_run(run_id, conf, claim_note(url, 8))
        caplog.set_level(logging.WARNING, logger="onceflow.run_notes")
        notes = ArticleRunNotes(retry_delays=())
        # only this run's job: the catch-up would queue the untitled runs other tests left in the
        # shared metadata database, each one more connect_timeout against the silent ledger
        notes._swept = True

        notes.submit(job_of(run_id))
        # the 1 s delay, then connect_timeout (5 s; libpq may try twice, with and without SSL)
        assert notes.wait_idle(45), "the writer is still waiting for the ledger"
    finally:
        silent.close()

    assert stored(run_id) == (claim_note(url, 8), "success")
    assert any(
        "ledger could not be read" in r.getMessage() and run_id in r.getMessage() for r in caplog.records
    )


@pytest.mark.postgres
def test_the_listeners_ledger_connections_have_socket_deadlines(postgres_url: str) -> None:
    """What ``connect_timeout`` cannot cover (an open connection whose peer vanished) TCP keepalives
    and ``tcp_user_timeout`` do; libpq reports the options the connection really has."""
    notes = ArticleRunNotes()
    engine = notes._ledger_engine(postgres_url)
    try:
        with engine.connect() as conn:
            options = conn.connection.dbapi_connection.get_dsn_parameters()
            name = conn.execute(sa.text("SHOW application_name")).scalar()
    finally:
        engine.dispose()
    assert name == APPLICATION_NAME
    assert {k: options.get(k) for k in ("connect_timeout", "keepalives", "tcp_user_timeout")} == {
        "connect_timeout": "5",
        "keepalives": "1",
        "tcp_user_timeout": "5000",
    }
    assert int(options["keepalives_idle"]) <= 5 and int(options["keepalives_count"]) <= 3


@dataclass(frozen=True)
class UnreadableJob(NoteJob):
    """A job whose ledger read fails every time (as one queued by an earlier test whose ledger has
    gone since): it is tried again after each of the writer's ``retry_delays``."""

    @property
    def run_prefix(self) -> str:
        raise RuntimeError("this run's ledger is gone")


@dataclass(frozen=True)
class SlowJob(NoteJob):
    """A job whose ledger read takes a second, and says when it began."""

    started: ClassVar[threading.Event] = threading.Event()

    @property
    def run_prefix(self) -> str:
        SlowJob.started.set()
        time.sleep(1.0)
        return super().run_prefix


def test_waiting_for_a_runs_note_is_not_held_by_another_runs_tries(
    airflow_db: object, article_ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """``wait_idle(runs=...)`` waits for those runs' notes only. A test that waited for the whole
    queue failed whenever an earlier test's run (its ledger dropped since) was still between its
    tries, minutes apart: CI's full suite failed that way on 2026-12-04."""
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/propio"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 2))
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Propio"}})
    caplog.set_level(logging.WARNING, logger="onceflow.run_notes")
    SlowJob.started.clear()
    notes = ArticleRunNotes(retry_delays=(600.0,), delay_s=0.1)
    notes._swept = True  # only the jobs of this test
    # its queue keeps a try due in ten minutes: pytest's exit is not to wait for it, nor warn
    atexit.unregister(notes._at_exit)
    stale = job_of(run_id)
    notes.submit(
        UnreadableJob(stale.dag_id, "an-earlier-tests-run", stale.row_key, stale.recheck_key, stale.url)
    )
    assert eventually(lambda: any("an-earlier-tests-run" in r.getMessage() for r in caplog.records))

    job = job_of(run_id)
    notes.submit(SlowJob(job.dag_id, job.run_id, job.row_key, job.recheck_key, job.url))
    assert SlowJob.started.wait(30), "the writer did not take the job"
    # while it is being written (no longer queued), it is still waited for
    assert notes.wait_idle(30, runs=[(CHAIN, run_id)]), "held by the other run's next try"

    assert stored(run_id) == (f"Propio — {claim_note(url, 2)}", "success")
    assert not notes.wait_idle(0.5), "the other run's next try is still queued"
    assert notes.wait_idle(0.5, runs=[(CHAIN, "a-run-never-queued")])


@dataclass(frozen=True)
class DyingJob(NoteJob):
    """A job whose reading ends the writer thread (a ``BaseException`` no ``except Exception``
    stops), as a thread can die of anything that is not an ``Exception``."""

    @property
    def run_prefix(self) -> str:
        raise SystemExit("the writer thread ends here")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the SystemExit
def test_a_writer_thread_that_died_or_never_started_is_started_again(
    airflow_db: object, article_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = []
    for name in ("unstarted", "after-death"):
        url = f"https://news.example/{uuid.uuid4().hex[:8]}/{name}"
        run_id, conf, key = article(url)
        add_run(run_id, conf, claim_note(url, 1))
        commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": name}})
        runs.append((run_id, url))
    notes = ArticleRunNotes()

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:  # the process is out of threads for a moment
        patched.setattr(threading.Thread, "start", no_thread)
        notes.submit(job_of(runs[0][0]))
    assert not notes.wait_idle(1.5), "written without a writer thread?"
    job = job_of(runs[1][0])
    notes.submit(DyingJob(job.dag_id, "no-such-run", job.row_key, job.recheck_key, job.url))
    assert notes.wait_idle(30, runs=[(job.dag_id, "no-such-run")]), "a dead writer's job is still waited for"
    assert notes.wait_idle(30), "the first job was not written: the writer was never started again"
    notes.submit(job)  # the writer died on the last job: a new one is started
    assert notes.wait_idle(30), "the writer died and was not started again"

    assert stored(runs[0][0]) == (f"unstarted — {claim_note(runs[0][1], 1)}", "success")
    assert stored(runs[1][0]) == (f"after\\-death — {claim_note(runs[1][1], 1)}", "success")


def test_a_process_that_exits_writes_the_notes_it_queued_first(
    airflow_db: object, article_ledger: Ledger
) -> None:
    """The writer is a daemon thread: a process that ends (a scheduler stopped, an api-server
    worker recycled) a moment after a run ended still writes that run's note (``atexit``)."""
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/exit"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 2))
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Al salir"}})
    script = textwrap.dedent(
        f"""
        import sqlalchemy as sa
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from onceflow.run_notes import RUN_NOTES

        with create_session() as session:
            run = session.scalars(
                sa.select(DagRun).where(DagRun.dag_id == {CHAIN!r}, DagRun.run_id == {run_id!r})
            ).one()
            RUN_NOTES.run_ended(run)
        # the interpreter exits now; the note is due in a second
        """
    )

    done = subprocess.run(
        [sys.executable, "-c", script], env=os.environ.copy(), capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert stored(run_id) == (f"Al salir — {claim_note(url, 2)}", "success")


def test_a_writer_that_starts_titles_the_runs_that_ended_before_its_process(
    airflow_db: object, article_ledger: Ledger
) -> None:
    """A scheduler stopped between a run's end and its note (or a note given up) leaves the run
    untitled; the next process's writer, when it starts, queues the article runs that ended in
    the day before the process started and whose note has no title."""
    now = datetime.now(UTC)
    made: dict[str, tuple[str, str]] = {}
    for name, note, by, ended in (
        ("claimed", "claim", None, now - timedelta(hours=1)),
        ("no-note", None, None, now - timedelta(hours=2)),
        ("person", "Ana: checked by hand", "ana", now - timedelta(hours=1)),  # not ours to judge
        ("too-old", "claim", None, now - timedelta(hours=30)),  # before the catch-up's day
    ):
        url = f"https://news.example/{uuid.uuid4().hex[:8]}/{name}"
        run_id, conf, key = article(url)
        add_run(run_id, conf, claim_note(url, 7) if note == "claim" else note, by=by, ended=ended)
        commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": name}})
        made[name] = (run_id, url)
    try:
        url = f"https://news.example/{uuid.uuid4().hex[:8]}/now"
        run_id, conf, key = article(url)
        add_run(run_id, conf, claim_note(url, 9))
        commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Ahora"}})
        notes = ArticleRunNotes()  # the restarted scheduler's, started after those runs ended

        notes.submit(job_of(run_id))  # the first run that ends under it
        assert notes.wait_idle(30)

        assert stored(run_id) == (f"Ahora — {claim_note(url, 9)}", "success")
        claimed, no_note, person, too_old = (made[n] for n in ("claimed", "no-note", "person", "too-old"))
        assert stored(claimed[0]) == (f"claimed — {claim_note(claimed[1], 7)}", "success")
        assert stored(no_note[0]) == (f"no\\-note — {no_note[1]}", "success")
        assert stored(person[0]) == ("Ana: checked by hand", "success")
        assert stored(too_old[0]) == (claim_note(too_old[1], 7), "success")
    finally:
        delete_runs(*(r for r, _ in made.values()))
