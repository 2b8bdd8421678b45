"""Helpers for tests that build the wheel and install it into an environment of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROVIDER = "airflow-provider-onceflow"


def uv_cmd() -> list[str]:
    """uv from the test's own environment (a dev dependency)."""
    return [sys.executable, "-m", "uv"]


def clean_env() -> dict[str, str]:
    """The environment for another venv: no Airflow settings, no active venv, no PYTHONPATH (a
    developer's ``PYTHONPATH=providers`` would import the source tree instead of the wheel) but
    the network guard's folder, whose sitecustomize imports the guard from the installed wheel."""
    from onceflow.testing import network_guard

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "VIRTUAL_ENV", "UV_")) and k != "PYTHONPATH"
    }
    if network_guard.ENV_LOG in os.environ:  # only the guard's sitecustomize, not the source tree
        env.update(network_guard.child_environment(os.environ[network_guard.ENV_LOG], base={}))
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def check_run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``args``; a non-zero exit fails the test with both output streams."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done


def installed_packages(python: Path) -> dict[str, str]:
    """``{name: version}`` of what is installed for ``python``."""
    out = check_run(
        [*uv_cmd(), "pip", "list", "--format", "json", "--python", str(python)], env=clean_env()
    ).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def build_wheel(out: Path) -> Path:
    """Build the provider's wheel from the repository into ``out``."""
    check_run([*uv_cmd(), "build", "--wheel", "--out-dir", str(out), str(REPO)], env=clean_env())
    (built,) = out.glob("airflow_provider_onceflow-*.whl")
    return built


def last_json_line(stdout: str, prefix: str) -> object:
    """The JSON after ``prefix`` on the last line that starts with it (Airflow logs to stdout too)."""
    lines = [line for line in stdout.splitlines() if line.startswith(prefix)]
    assert lines, f"no {prefix!r} line in:\n{stdout[-4000:]}"
    return json.loads(lines[-1][len(prefix) :])
