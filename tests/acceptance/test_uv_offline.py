"""The wheel tests' uv never reaches a package index (uv is not Python: the network guard cannot
see it). Its calls run offline from the cache ``make install`` filled, with every proxy variable
pointing at a closed loopback port as a belt; a machine that skipped ``make install`` fails with
a message that says so. Cheap: a few uv calls that resolve nothing (about a second in all).
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import wheel_env
from wheel_env import CLOSED_PROXY, require_prepared, uv_cmd, uv_env

HERE = Path(__file__).parent
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def _resolve_uncached(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A plan for a package no cache holds (a fresh random name), against the test's own venv."""
    name = f"onceflow-not-cached-{uuid.uuid4().hex[:12]}"
    return subprocess.run(
        [*uv_cmd(), "pip", "install", "--dry-run", "--python", sys.executable, name],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_uv_environment_is_offline_behind_a_closed_loopback_proxy() -> None:
    env = uv_env()
    assert env["UV_OFFLINE"] == "1"
    assert env["UV_HTTP_RETRIES"] == "0"
    assert {env[name] for name in PROXIES} == {CLOSED_PROXY}
    assert "NO_PROXY" not in env and "no_proxy" not in env
    # the proxy port is closed: a request that slipped past UV_OFFLINE is refused on this machine
    host, port = CLOSED_PROXY.removeprefix("http://").split(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_an_offline_resolution_of_an_uncached_package_fails_instead_of_fetching() -> None:
    done = _resolve_uncached(uv_env())
    assert done.returncode != 0
    assert "not found in the cache" in done.stderr and "network was disabled" in done.stderr, done.stderr


def test_without_uv_offline_the_closed_proxy_still_refuses_at_once() -> None:
    env = {k: v for k, v in uv_env().items() if k != "UV_OFFLINE"}
    done = _resolve_uncached(env)
    assert done.returncode != 0
    assert "Connection refused" in done.stderr, done.stderr


def test_every_uv_call_of_the_wheel_tests_runs_in_the_offline_environment() -> None:
    """Each function of tests/acceptance that builds a uv command line also builds its
    environment with ``uv_env`` (``run_uv`` does both); ``prepare`` alone goes online."""
    offenders = []
    for path in sorted(HERE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name in ("uv_cmd", "_resolve_uncached"):
                continue
            called = {
                c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            }
            if "uv_cmd" in called and "uv_env" not in called:
                offenders.append(f"{path.name}:{node.lineno} {node.name}")
            online = [
                kw
                for c in ast.walk(node)
                if isinstance(c, ast.Call)
                for kw in c.keywords
                if kw.arg == "online" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
            ]
            if online and path.name != "wheel_env.py":
                offenders.append(f"{path.name}:{node.lineno} {node.name} (online)")
    assert offenders == [], f"uv run outside uv_env(): {offenders}"


def test_a_machine_that_skipped_make_install_is_told_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_prepared()  # here it was run
    monkeypatch.setenv("ONCEFLOW_VENV_CACHE", str(tmp_path))  # an empty cache: a fresh machine
    with pytest.raises(AssertionError, match=r"run `make install`"):
        require_prepared()
    with pytest.raises(AssertionError, match=r"run `make install`"):
        wheel_env.run_uv(["pip", "install", "--dry-run", "--python", str(tmp_path / "none"), "nothing-here"])
