"""A new user who reads only the quickstart reaches a published article and a loaded sales day.

The test runs the quickstart's commands (every ``$ `` line of its ``console`` blocks, read from
docs/quickstart.md) in the order the page gives them, in a shell from the repository's root. Only
what the page tells the reader to take from ``make run``'s banner is substituted: the home
(``.onceflow`` -> a temporary folder) and the ports (the UI's is passed as ``RUN_ARGS``; the
emulator's and the article site's are read from the banner, as the page says to). Commands the page
says to repeat until something shows (reading the queue until the row is DONE, reading
``load_audit`` once the backfill ran) are repeated until they show it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from docs_site import REPO_ROOT

from onceflow.testing.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.real_airflow]

# make run's first start, a claim, the whole article chain and a backfill, on a shared machine
FOLLOW_TIMEOUT = 2700

QUICKSTART = REPO_ROOT / "docs" / "quickstart.md"


def quickstart_commands(text: str) -> list[str]:
    """The ``$ `` lines of the page's ``console`` blocks, in order."""
    commands, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```console"
            continue
        if inside and line.startswith("$ "):
            commands.append(line[2:])
    return commands


def test_the_quickstart_lists_its_steps_in_order() -> None:
    commands = quickstart_commands(QUICKSTART.read_text(encoding="utf-8"))
    kinds = [c.split()[0] for c in commands]
    assert kinds[0] == "make" and commands[0] == "make run"
    assert "curl" in kinds and any("airflow backfill create" in c for c in commands)
    assert "load_audit" in commands[-1]


def _shell(command: str, env: dict[str, str], timeout: float = 300) -> str:
    print(f"$ {command}", flush=True)
    proc = subprocess.run(
        ["bash", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{command!r} failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _until(what: str, check, timeout: float, proc: subprocess.Popen[str]):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"make run exited with {proc.returncode}"
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(5)


def _row(queue_json: str, url: str) -> dict[str, str] | None:
    values = json.loads(queue_json).get("values", [])
    header = values[0]
    for row in values[1:]:
        cells = dict(zip(header, row + [""] * (len(header) - len(row)), strict=True))
        if cells.get("url") == url:
            return cells
    return None


def _done_row(command: str, env: dict[str, str], url: str):  # type: ignore[no-untyped-def]
    def check() -> dict[str, str] | None:
        row = _row(_shell(command, env), url)
        return row if row and row["status"].startswith("DONE") and row.get("published_url") else None

    return check


def _output_with(command: str, env: dict[str, str], text: str):  # type: ignore[no-untyped-def]
    def check() -> str | None:
        out = _shell(command, env)
        return out if text and text in out else None

    return check


#: Where the screenshots go: committed, and shown by docs/quickstart.md (`make docs-screenshots`
#: re-takes them by running this test).
SHOTS = REPO_ROOT / "docs" / "img"


class Screens:
    """A headless Chromium logged in to make run's UI with the banner's user and password."""

    def __init__(self, ui: str, user: str, password: str) -> None:
        from browser_links import CHROMIUM, CHROMIUM_ARGS
        from playwright.sync_api import sync_playwright

        self._p = sync_playwright().start()
        self._browser = self._p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        self.page = self._browser.new_page(viewport={"width": 1280, "height": 800})
        self.ui = ui
        self.page.goto(ui + "/", timeout=120_000)
        self.page.get_by_label("Username").fill(user)
        self.page.get_by_label("Password").fill(password)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(ui + "/", timeout=120_000)

    def take(self, name: str, url: str, shows: str) -> None:
        """Open ``url``, wait until ``shows`` is on the page, and save ``docs/img/<name>``."""
        self.page.goto(url, wait_until="networkidle", timeout=120_000)
        self.page.get_by_text(shows).first.wait_for(timeout=120_000)
        SHOTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(SHOTS / name))

    def close(self) -> None:
        self._browser.close()
        self._p.stop()


@pytest.mark.timeout(FOLLOW_TIMEOUT)
def test_following_the_quickstart_publishes_an_article_and_loads_a_sales_day(tmp_path: Path) -> None:
    commands = quickstart_commands(QUICKSTART.read_text(encoding="utf-8"))
    home, ui_port = tmp_path / "home", free_port()
    drop = ("AIRFLOW", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")  # not the outer make's
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    log = tmp_path / "up.log"
    screens: Screens | None = None

    assert commands[0] == "make run"
    print(f"$ make run  (ONCEFLOW_HOME={home} RUN_ARGS='--port {ui_port}')", flush=True)
    with log.open("w") as out:
        up = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"ONCEFLOW_HOME={home}", f"RUN_ARGS=--port {ui_port}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        _until("make run's banner", lambda: "onceflow is running" in log.read_text(), 600, up)
        banner = log.read_text()
        user, password = re.search(r"user '([^']+)', password '([^']+)'", banner).groups()  # type: ignore[union-attr]
        sheet_view = re.search(r"The demo sheet\s+(http://\S+)", banner).group(1)  # type: ignore[union-attr]
        ui = f"http://localhost:{ui_port}"
        screens = Screens(ui, user, password)
        # the first five minutes: the repository's DAGs, unpaused, running
        screens.take("quickstart-first-minutes.png", ui + "/dags", "article_pipeline")
        emulator = re.search(r"(?:Sheets emulator|The demo sheet)\s+http://127\.0\.0\.1:(\d+)/", banner)
        site = re.search(r"Article site\s+http://127\.0\.0\.1:(\d+)/", banner)
        assert emulator and site, banner

        def as_run_here(command: str) -> str:
            command = command.replace("127.0.0.1:8090", f"127.0.0.1:{emulator.group(1)}")
            command = command.replace("127.0.0.1:8765", f"127.0.0.1:{site.group(1)}")
            return command.replace(".onceflow/", f"{home}/")

        added_url = backfilled_day = published = ""
        for command in map(as_run_here, commands[1:]):
            if "values/queue!A1:append" in command:
                added_url = re.search(r'\[\["([^"]+)"', command).group(1)  # type: ignore[union-attr]
                _shell(command, env)
            elif "/values/queue" in command and added_url:
                row = _until(
                    "the added row to be DONE with its link", _done_row(command, env, added_url), 900, up
                )
                published = row["published_url"]
                screens.take("quickstart-queue.png", sheet_view, added_url)
                # the demo's huertos-urbanos waits for a reviewer by now
                screens.take("quickstart-review.png", ui + "/required_actions", "Review")
            elif "backfill create" in command:
                day = re.search(r'--from-date ("[^"]*"|\S+)', command).group(1)  # type: ignore[union-attr]
                backfilled_day = _shell(f"echo {day}", env).strip()[:10]
                _shell(command, env)
            elif "load_audit" in command:
                audit = _until(
                    "the backfilled day in load_audit", _output_with(command, env, backfilled_day), 900, up
                )
                assert re.search(rf"\('{backfilled_day}', [1-9]\d*, \d+\)", audit), audit
                screens.take("quickstart-backfill.png", ui + "/dags/daily_sales/runs", "backfill")
            else:
                _shell(command, env)
        assert added_url and published, "the quickstart adds no row or never reads the queue again"
        page = _shell(f"curl -sf {published}", env)
        assert "<html" in page.lower()
        screens.take("quickstart-published.png", published, "Machine translation")
    finally:
        if screens is not None:
            screens.close()
        with contextlib.suppress(ProcessLookupError):  # make run may have exited (the failure above)
            os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=120)
