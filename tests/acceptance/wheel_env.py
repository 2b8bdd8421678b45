"""Helpers for tests that build the wheel and install it into an environment of its own."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROVIDER = "airflow-provider-onceflow"

#: Per supported minor: the release tested and the day uv resolves its dependencies as of (its
#: release day, standing in for the release's constraints file). Add a row when a new minor is
#: declared (tests/acceptance/test_airflow_versions.py checks).
RELEASES: dict[str, tuple[str, str]] = {
    "3.1": ("3.1.8", "2026-04-01"),
    "3.2": ("3.2.2", "2026-06-01"),
    "3.3": ("3.3.2", "2026-10-01"),
}
#: Airflow's own distributions: an install of the provider must never change these.
AIRFLOW_DISTRIBUTIONS = ("apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk")


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


def cache_root() -> Path:
    """``$ONCEFLOW_VENV_CACHE`` (default ``~/.cache/onceflow/airflow-venvs``), one folder per uv.lock."""
    default = Path.home() / ".cache" / "onceflow" / "airflow-venvs"
    lock = hashlib.sha256((REPO / "uv.lock").read_bytes()).hexdigest()[:16]
    return Path(os.environ.get("ONCEFLOW_VENV_CACHE", default)) / lock


def plain_airflow_venv(minor: str) -> Path:
    """A cached venv with only ``apache-airflow==<release>`` of ``minor``, resolved as of its
    release day: a cluster's Airflow before onceflow is installed. Never modified by the tests."""
    version, resolved_as_of = RELEASES[minor]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"plain-airflow-{version}"
    env = clean_env()
    with open(root / f"plain-airflow-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions share the cache: one builds, one waits
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            check_run([*uv_cmd(), "venv", "--python", sys.executable, str(venv)], env=env)
            py = str(venv / "bin" / "python")
            install = [*uv_cmd(), "pip", "install", "--python", py, "--exclude-newer", resolved_as_of]
            check_run([*install, f"apache-airflow=={version}"], env=env)
            (venv / ".complete").touch()
    return venv


_CHANGE = re.compile(r"^ ([-+]) ([A-Za-z0-9._-]+)(?:==| @ )(\S+)")  # name==1.2 or name @ file://...


def planned_changes(output: str) -> dict[str, tuple[str | None, str | None]]:
    """``{name: (before, after)}`` from a ``uv pip install --dry-run`` report (None: absent)."""
    changes: dict[str, list[str | None]] = {}
    for line in output.splitlines():
        match = _CHANGE.match(line)
        if match:
            sign, name, version = match.groups()
            pair = changes.setdefault(name.lower(), [None, None])
            pair[0 if sign == "-" else 1] = version
    return {name: (pair[0], pair[1]) for name, pair in changes.items()}
