"""``onceflow sheets-emulator OPTIONS`` hands every option to the emulator (docker-compose.yaml runs
it so); argparse's REMAINDER used to refuse the first option (``unrecognized arguments: --port``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path


def test_the_console_script_starts_the_emulator_with_its_options(tmp_path: Path) -> None:
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"spreadsheetId": "s1", "title": "t", "sheets": {"queue": [["url"]]}}))
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--state",
        str(tmp_path / "state.json"),
        "--seed",
        str(seed),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceflow.cli", "sheets-emulator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "Sheets API emulator listening on <endpoint>", or EOF
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+/?)", first)
        assert found, f"no endpoint in {first!r} (exit code {proc.poll()})"
        endpoint = found.group(1)
        with urllib.request.urlopen(f"{endpoint.rstrip('/')}/v4/spreadsheets/s1", timeout=10) as response:
            assert json.load(response)["spreadsheetId"] == "s1"  # the --seed option was taken
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_bad_option_is_reported_by_the_emulator_parser() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "sheets-emulator", "--port", "not-a-number"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "sheets_emulator" in done.stderr and "--port" in done.stderr
