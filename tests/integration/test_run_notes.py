"""The article's title in its run's note (``onceflow.run_notes``), against the real metadata DB.

The listener is reached the way Airflow reaches it: through Airflow's own listener manager (which
loads it from onceflow's plugin), with a real ``dag_run`` row, or from ``dag.test()`` (3.3.2's
``dag.test`` calls ``DagRun.update_state``, which calls the dag-run listeners, as the scheduler
does). The ledger is real (SQLite file and PostgreSQL); notes are read back with plain SQL.
The whole chain's note, from a real ``extract``, is checked in ``test_article_chain.py`` and,
under a real scheduler, in ``tests/acceptance/test_article_chain_cluster.py``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.operators.sheets import claim_note
from onceflow.run_notes import RUN_NOTES
from onceflow.sheets.keys import article_run_conf, normalise_url, pipeline_run_id, row_key
from onceflow.sheets.ledger_link import work_key

if TYPE_CHECKING:
    from collections.abc import Iterator

CHAIN = "article_pipeline"


@pytest.fixture
def article_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """``onceflow_ledger`` pointed at a fresh ledger (SQLite file or PostgreSQL database)."""
    conn = {"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger_url}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps(conn))
    engine = create_ledger_engine(ledger_url)
    try:
        yield Ledger(engine)
    finally:
        engine.dispose()


@pytest.fixture
def broken_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``onceflow_ledger`` pointed at a file that is not a database."""
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not an SQLite database, " * 64)
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return path


def article(url: str) -> tuple[str, dict[str, str], str]:
    """Run id, run conf and ledger key of the claimed row of ``url``."""
    key = row_key(normalise_url(url))
    conf = article_run_conf(
        token=uuid.uuid4().hex[:12], key=key, url=url, spreadsheet_id="sheet", sheet="queue", version="v1"
    )
    return pipeline_run_id(key, "v1"), conf, work_key(key)


def add_run(run_id: str, conf: dict[str, str], note: str | None, state: str = "success") -> None:
    """A real ``dag_run`` row (and its ``dag_run_note``), as ``sheet_claim`` left it, now ended."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    with create_session() as session:
        session.add(
            DagRun(dag_id=CHAIN, run_id=run_id, run_type=DagRunType.MANUAL, conf=conf, state=state, note=note)
        )


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
        assert RUN_NOTES.wait_idle(30), "the note writer did not finish"


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
    airflow_db: object, article_ledger: Ledger
) -> None:
    """The UI's "mark as" dialog sends a note with the state: the listener's writer reads the note
    before that request commits and must not write its own over it (compare and set)."""
    from airflow import settings

    url = f"https://news.example/{uuid.uuid4().hex[:8]}/gazpacho"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 2))
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}, "extract": {"title": "Gazpacho"}})
    edited = "Ana: the row moved to the archive tab"
    with settings.engine.connect() as conn:
        edit = conn.begin()
        conn.execute(
            sa.text(
                "UPDATE dag_run_note SET content = :c WHERE dag_run_id = "
                "(SELECT id FROM dag_run WHERE dag_id = :d AND run_id = :r)"
            ),
            {"c": edited, "d": CHAIN, "r": run_id},
        )
        end_run(run_id, wait=False)  # the writer reads the claim note, then waits for the edit's lock
        time.sleep(1.5)
        edit.commit()
    assert RUN_NOTES.wait_idle(30)

    assert stored(run_id) == (f"Gazpacho — {url}\n\n{edited}", "success")


def test_a_run_that_ended_before_extract_and_other_dags_runs_are_left_alone(
    airflow_db: object, article_ledger: Ledger
) -> None:
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/gone"
    run_id, conf, key = article(url)
    add_run(run_id, conf, claim_note(url, 5), state="failed")
    commit_steps(article_ledger, key, run_id, {"fetch": {"url": url}})  # extract never committed

    end_run(run_id)

    assert stored(run_id) == (claim_note(url, 5), "failed")


def test_a_ledger_error_leaves_the_run_and_its_note_as_they_were_with_a_warning(
    airflow_db: object, broken_ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"https://news.example/{uuid.uuid4().hex[:8]}/broken"
    run_id, conf, _ = article(url)
    add_run(run_id, conf, claim_note(url, 4))
    caplog.set_level(logging.WARNING, logger="onceflow.run_notes")

    end_run(run_id)

    assert stored(run_id) == (claim_note(url, 4), "success")
    [warning] = [r for r in caplog.records if r.name == "onceflow.run_notes"]
    assert warning.levelno == logging.WARNING
    assert "ledger could not be read" in warning.getMessage() and run_id in warning.getMessage()


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
    assert RUN_NOTES.wait_idle(30)

    assert run.state == "success"
    assert stored(run.run_id) == (None, "success")
    messages = [r.getMessage() for r in caplog.records if r.name == "onceflow.run_notes"]
    assert any("ledger could not be read" in m and run.run_id in m for m in messages), messages
