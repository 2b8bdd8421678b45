"""`make run` shows the operations view with the demo's live state: once the UI answers, the page
is in Airflow's navigation and the six answers move as the demo rows are claimed and published.

Slow (the whole demo runs: claims, article chains, publishes): ``make test-slow``. It starts
``onceflow up`` (what ``make run`` runs) on its own home and port, with the make-run defaults:
SimpleAuthManager with every user an admin, so the view is read without a login, as a local
user would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from onceflow.testing.ports import free_port

pytestmark = [pytest.mark.real_airflow, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# How long the answers may take to move before the test gives up: a hang guard, not a speed
# assertion (the time it took is printed with the load average; docs/operations-view.md has one).
GIVE_UP_S = 420.0


TOKEN: dict[str, str] = {}  # make run asks for a login: the banner's user and password


def _get(url: str) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {TOKEN['value']}"} if TOKEN else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def _figures(doc: dict[str, Any]) -> dict[str, Any]:
    """What a person watching the page sees change while the demo runs."""
    kinds = {k["kind"]: k["created_in_window"] for k in doc["discovery"]["kinds"]}
    return {
        "articles discovered": kinds.get("article", 0),
        "completed": doc["discovery"]["completed_in_window"],
        "eligible": doc["oldest_eligible"]["eligible_items"],
        "results by version": {v["version"]: v["results"] for v in doc["active_versions"]["versions"]},
        "live by version": {v["version"]: v["live_items"] for v in doc["active_versions"]["versions"]},
    }


def test_make_run_shows_the_six_answers_moving(tmp_path: Path) -> None:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"))
    }
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [
            str(REPO / ".venv" / "bin" / "onceflow"),
            "up",
            "--home",
            str(tmp_path / "home"),
            "--port",
            str(port),
            "--demo-days",
            "3",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    seen: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 600
        while "onceflow is running" not in (tmp_path / "up.log").read_text():
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no banner in 600 s"
            time.sleep(1)
        banner = (tmp_path / "up.log").read_text()
        user, password = re.search(r"user '([^']+)', password '([^']+)'", banner).groups()  # type: ignore[union-attr]
        login = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": user, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(login, timeout=60) as resp:
            TOKEN["value"] = json.load(resp)["access_token"]
        assert f"{base}/onceflow-ops/" in banner or f"localhost:{port}/onceflow-ops/" in banner
        status, raw = _get(f"{base}/api/v2/plugins")
        assert status == 200, raw[:500]
        assert any(
            v.get("url_route") == "onceflow-ops"
            for p in json.loads(raw)["plugins"]
            for v in p["external_views"]
        )
        started = time.monotonic()
        first: dict[str, Any] | None = None
        moved: set[str] = set()
        while time.monotonic() - started < GIVE_UP_S:
            status, raw = _get(f"{base}/onceflow-ops/api/v1/questions")
            if status == 200:
                now = _figures(json.loads(raw))
                seen.append({"t": round(time.monotonic() - started), **now})
                if first is None:
                    first = now
                moved |= {k for k in now if now[k] != first[k]}
                if {"articles discovered", "completed", "results by version"} <= moved:
                    break
            time.sleep(5)
        took = time.monotonic() - started
        print(f"answers moved after {took:.0f} s (load average {os.getloadavg()}): {seen[-1]}")
        assert {"articles discovered", "completed", "results by version"} <= moved, seen
        status, raw = _get(f"{base}/onceflow-ops/")
        assert status == 200 and b'id="q1"' in raw
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        log.close()
