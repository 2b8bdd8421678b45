"""The README's demo, followed in headless Chromium as a newcomer would (issue 26, "Done when").

``make run`` on a fresh home; log in with the banner's user and password; wait until the demo
sheet (the emulator's HTML view) shows three DONE rows; open Browse -> Required Actions, open the
review, press Reject with the note left empty and see it refused with its reason, then press
Approve with the note left empty; the row ends DONE with its link and the
reviewer's name; backfill three days of ``daily_sales`` from the UI's Trigger -> Backfill dialog
by picking the first day 00:00 and the last day 00:00, as a person in the business timezone
would (the browser itself is in UTC: the UI starts in the business timezone because ``make run``
says so), and get three runs, no deadline among them; then, ten minutes later, no DAG has a new
DAG version. ``ONCEFLOW_DEMO_VERSION_WAIT`` (seconds) shortens that wait for a local try only.

Long (about 25 minutes): ``slow``. The quick tests of each defect are in ``make test``:
``test_dag_versions_stable.py``, ``test_article_review_form.py``, ``test_local_api_guard.py``,
``test_sheets_emulator_view.py``, ``test_make_run.py`` (listeners, Host, cross-origin).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from test_make_run import _stop, _wait_for, _wait_for_banner

from onceflow.testing.ports import free_port

pytestmark = [pytest.mark.real_airflow, pytest.mark.slow]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VERSION_WAIT = float(os.environ.get("ONCEFLOW_DEMO_VERSION_WAIT", "600"))


def _query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db, timeout=30) as conn:
        return list(conn.execute(sql, params))


def _cells(page: Any, url: str) -> list[list[str]]:
    """The demo sheet's queue rows as the browser shows them (the emulator's read-only view)."""
    page.goto(url)
    table = page.locator("table").first
    table.wait_for()
    return [
        [c.strip() for c in row.locator("td").all_inner_texts()][1:]  # without the row number
        for row in table.locator("tr").all()[1:]
    ]


@pytest.mark.timeout(3600)  # the walk is ~15 minutes under load, then the 10-minute watch
def test_the_readme_demo_through_the_ui(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = _start_make_run_days(tmp_path, port, days=6)
    try:
        _wait_for_banner(tmp_path, proc)
        banner = (tmp_path / "up.log").read_text()
        user, password = re.search(r"user '([^']+)', password '([^']+)'", banner).groups()  # type: ignore[union-attr]
        ui = f"http://localhost:{port}"
        sheet = re.search(r"The demo sheet\s+(http://\S+)", banner).group(1)  # type: ignore[union-attr]
        db = tmp_path / "home" / "airflow" / "airflow.db"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            context = browser.new_context(timezone_id="UTC", viewport={"width": 1400, "height": 1200})
            page = context.new_page()
            page.set_default_timeout(120_000)
            try:
                _log_in(page, ui, user, password)
                header = _wait_for_three_done(page, sheet, proc)
                _approve_with_no_note(page, ui)
                _the_reviewed_row_is_done_with_link_and_reviewer(page, sheet, header, user, proc)
                days = _backfill_three_days_in_the_dialog(page, ui)
            except BaseException:
                page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
                raise
            finally:
                browser.close()
        _three_backfill_runs_succeed_without_deadlines(db, days, proc)

        versions = _query(db, "SELECT dag_id, count(*) FROM dag_version GROUP BY dag_id")
        hashes = _query(db, "SELECT dag_id, dag_hash FROM serialized_dag ORDER BY dag_id")
        time.sleep(VERSION_WAIT)
        assert proc.poll() is None
        assert _query(db, "SELECT dag_id, count(*) FROM dag_version GROUP BY dag_id") == versions
        assert _query(db, "SELECT dag_id, dag_hash FROM serialized_dag ORDER BY dag_id") == hashes
        assert dict(versions)["daily_sales"] == 1, versions
    finally:
        _stop(proc)


def _start_make_run_days(tmp_path: Path, port: int, days: int) -> Any:
    """``make run`` with this many demo days (the backfill needs days before yesterday)."""
    import subprocess

    drop = ("AIRFLOW", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    with (tmp_path / "up.log").open("w") as log:
        return subprocess.Popen(
            [
                "make",
                "--no-print-directory",
                "run",
                f"ONCEFLOW_HOME={tmp_path / 'home'}",
                f"RUN_ARGS=--port {port} --demo-days {days}",
            ],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _log_in(page: Any, ui: str, user: str, password: str) -> None:
    page.goto(ui + "/")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(ui + "/")
    # the UI starts in the business timezone although the browser is in UTC
    assert page.evaluate("localStorage.getItem('timezone')") == '"Europe/Amsterdam"'


def _wait_for_three_done(page: Any, sheet: str, proc: Any) -> list[str]:
    header: list[str] = []
    seen: list[list[str]] = []

    def three_done() -> bool:
        nonlocal header, seen
        page.goto(sheet)
        page.locator("table").first.wait_for()
        header = page.locator("table").first.locator("tr").first.locator("th").all_inner_texts()[1:]
        seen = _cells(page, sheet)
        return sum(1 for r in seen if r[header.index("status")].startswith("DONE #")) >= 3

    try:
        _wait_for(three_done, 1200, "three DONE rows in the sheet view", proc)
    except BaseException:
        print("the sheet when the wait ended:", seen)
        raise
    status = [r[header.index("status")] for r in seen]
    comments = {r[header.index("url")].rsplit("/", 1)[-1]: r[header.index("comment")] for r in seen}
    assert comments["notes.pdf"].startswith("fails on purpose"), comments
    assert comments["festa-major.html"].startswith("fails on purpose"), comments
    assert sum(s.startswith("DONE #") for s in status) == 3, status
    return header


def _approve_with_no_note(page: Any, ui: str) -> None:
    def waiting() -> bool:
        page.goto(ui + "/required_actions")
        try:
            page.get_by_role("link", name=re.compile("^Review: ")).first.wait_for(timeout=20_000)
        except Exception:
            return False
        return True

    deadline = time.monotonic() + 900
    while not waiting():
        assert time.monotonic() < deadline, "no review waited under Browse -> Required Actions"
    page.get_by_role("link", name=re.compile("^Review: ")).first.click()
    approve = page.get_by_role("button", name="Approve")
    approve.wait_for()
    body = page.inner_text("body")
    assert "Why it is below" in body and "no reasons given" not in body
    assert "readers will see it" in body
    assert approve.is_enabled(), "Approve must not need a note"
    # Reject with the note left empty is refused where the reviewer looks (the "Response failed"
    # toast says why; onceflow.hitl_guard) and the review keeps waiting
    page.get_by_role("button", name="Reject").click()
    refusal = page.get_by_text(re.compile(r"Reject needs 'note'")).first
    refusal.wait_for(timeout=60_000)
    # The error toast lies over the form's buttons and does not time out while the pointer is on
    # it: the reviewer closes it (or moves away and it goes) before the next click.
    close = page.locator('[data-scope="toast"] [data-part="close-trigger"]')
    if close.count():
        close.first.click()
    page.mouse.move(0, 0)
    refusal.wait_for(state="hidden", timeout=60_000)
    assert approve.is_enabled()
    approve.click()
    time.sleep(2)  # the answer is checked where it lands: the row (below)


def _the_reviewed_row_is_done_with_link_and_reviewer(
    page: Any, sheet: str, header: list[str], user: str, proc: Any
) -> None:
    rows: list[list[str]] = []

    def approved_row_done() -> bool:
        nonlocal rows
        rows = _cells(page, sheet)
        return any(
            r[header.index("status")].startswith("DONE #") and user in r[header.index("reason")] for r in rows
        )

    try:
        _wait_for(approved_row_done, 600, "the approved row DONE with the reviewer's name", proc)
    except BaseException:
        print("the sheet when the wait ended:", rows)
        raise
    [row] = [r for r in rows if user in r[header.index("reason")]]
    assert row[header.index("reason")] == f"approved in review by {user}"
    link = row[header.index("published_url")]
    assert link.startswith("http://127.0.0.1:") and "/published/" in link
    response = page.goto(link)  # the link a reader clicks
    assert response is not None and response.ok and page.title()


def _backfill_three_days_in_the_dialog(page: Any, ui: str) -> list[dt.date]:
    """Trigger -> Backfill on daily_sales, From = first day 00:00, To = last day 00:00: the dates
    a person in Amsterdam picks for three days (yesterday belongs to the scheduled run)."""
    today = dt.date.today()
    days = [today - dt.timedelta(days=n) for n in (4, 3, 2)]
    page.goto(ui + "/dags/daily_sales")
    page.get_by_role("button", name="Trigger").first.click()
    page.get_by_text("Run this Dag for a range of dates").click()
    for day in (days[0], days[-1]):
        page.get_by_text("Select date and time").first.click()
        page.get_by_placeholder("YYYY/MM/DD").fill(day.strftime("%Y/%m/%d"))
        page.get_by_placeholder("HH:mm").fill("00:00")
        page.keyboard.press("Enter")
        time.sleep(1)
        if page.get_by_placeholder("YYYY/MM/DD").count():
            page.keyboard.press("Escape")
    page.get_by_text("3 runs will be triggered.").wait_for()
    page.get_by_role("button", name="Run Backfill").click()
    page.get_by_text("Run Backfill").first.wait_for(state="detached")
    return days


def _three_backfill_runs_succeed_without_deadlines(db: Path, days: list[dt.date], proc: Any) -> None:
    from zoneinfo import ZoneInfo

    def done() -> bool:
        runs = _query(db, "SELECT state FROM dag_run WHERE dag_id = 'daily_sales' AND run_type = 'backfill'")
        return len(runs) == 3 and all(r[0] in ("success", "failed") for r in runs)

    _wait_for(done, 900, "three finished backfill runs of daily_sales", proc)
    runs = _query(
        db,
        "SELECT data_interval_start, state FROM dag_run WHERE dag_id = 'daily_sales' AND run_type = 'backfill' "
        "ORDER BY data_interval_start",
    )
    tz = ZoneInfo("Europe/Amsterdam")
    loaded = [
        dt.datetime.fromisoformat(str(start)).replace(tzinfo=dt.timezone.utc).astimezone(tz).date()
        for start, _ in runs
    ]
    assert loaded == days, runs
    assert [state for _, state in runs] == ["success"] * 3, runs
    deadlines = _query(
        db,
        "SELECT count(*) FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id WHERE r.run_type = 'backfill'",
    )
    assert deadlines == [(0,)]
