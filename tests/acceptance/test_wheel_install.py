"""`pip install` into an existing Airflow: the built wheel carries everything, and a fresh
environment with Airflow from the lock file finds the provider, its CLI and its pytest plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "uv", "build", "--wheel", "--out-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    (built,) = out.glob("airflow_provider_onceflow-*.whl")
    return built


def test_wheel_carries_code_sql_and_entry_points(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "onceflow/get_provider_info.py" in names
    assert "onceflow/py.typed" in names
    assert "onceflow/testing/pytest_plugin.py" in names
    sql_in_source = {
        str(p.relative_to(REPO / "providers")) for p in (REPO / "providers" / "onceflow").rglob("*.sql")
    }
    assert sql_in_source <= names
    assert not any(n.startswith(("tests/", "dags/", "benchmarks/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[apache_airflow_provider]" in text
    assert "onceflow.get_provider_info:get_provider_info" in text
    assert "[pytest11]" in text
    assert "onceflow = onceflow.cli:main" in text


def test_wheel_installs_into_a_fresh_airflow_environment(wheel: Path, tmp_path: Path) -> None:
    uv = [sys.executable, "-m", "uv"]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    venv = tmp_path / "venv"
    subprocess.run(
        [*uv, "venv", "--python", sys.executable, str(venv)], check=True, capture_output=True, env=env
    )
    reqs = tmp_path / "requirements.txt"
    subprocess.run(
        [*uv, "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "-o", str(reqs)],
        check=True,
        capture_output=True,
        cwd=REPO,
        env=env,
    )
    py = venv / "bin" / "python"
    # First "the existing cluster": Airflow and its providers as pinned by the lock, then onceflow.
    subprocess.run(
        [*uv, "pip", "install", "--python", str(py), "-r", str(reqs)],
        check=True,
        capture_output=True,
        env=env,
    )
    subprocess.run(
        [*uv, "pip", "install", "--python", str(py), str(wheel)], check=True, capture_output=True, env=env
    )
    run_env = {k: v for k, v in env.items() if not k.startswith("AIRFLOW")}
    run_env["AIRFLOW_HOME"] = str(tmp_path / "home")
    get = subprocess.run(
        [str(venv / "bin" / "airflow"), "providers", "get", "airflow-provider-onceflow"],
        capture_output=True,
        text=True,
        env=run_env,
    )
    assert get.returncode == 0, get.stderr
    assert "airflow-provider-onceflow" in get.stdout
    version = subprocess.run(
        [str(venv / "bin" / "onceflow"), "version"], capture_output=True, text=True, env=run_env
    )
    assert version.returncode == 0, version.stderr
    import onceflow

    assert version.stdout.strip() == onceflow.__version__
    plugins = subprocess.run(
        [str(py), "-m", "pytest", "--version", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        env=run_env,
        cwd=tmp_path,
    )
    # pytest is a dev dependency; a cluster without it simply has no plugin to load.
    if plugins.returncode == 0:
        assert "airflow-provider-onceflow" in plugins.stdout + plugins.stderr
