"""Helpers for tests that build the wheel and install it into an environment of its own.

uv is a Rust program, out of the network guard's sight, so the tests run it **offline**
(``uv_env()``: ``UV_OFFLINE=1``, and as a belt every proxy variable pointing at a closed loopback
port, no retries): it installs only what its cache already holds. ``make install`` fills that cache
with the network (``python tests/acceptance/wheel_env.py prepare``): it builds the wheel, the
cached venvs of every supported minor, and makes the same resolutions the tests make, then writes
a stamp. Without the stamp (``make install`` skipped) the wheel tests fail and say so.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version as installed_version
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


#: Where the offline uv's proxies point: a loopback port nothing listens on, so a request that
#: slipped past ``UV_OFFLINE`` is refused at once on this machine instead of leaving it.
CLOSED_PROXY = "http://127.0.0.1:9"
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
MAKE_INSTALL_HINT = (
    "run `make install`: it downloads what the wheel tests install (tests/acceptance/wheel_env.py "
    "prepare), and the tests run uv offline"
)


def uv_cmd() -> list[str]:
    """uv from the test's own environment (a dev dependency). Run it with ``run_uv``/``uv_env``."""
    return [sys.executable, "-m", "uv"]


def uv_env(*, online: bool = False) -> dict[str, str]:
    """The environment of a uv call: offline (the tests), or online (``prepare``, in ``make install``)."""
    env = clean_env()
    if "UV_CACHE_DIR" in os.environ:  # prepare and the tests must share one cache
        env["UV_CACHE_DIR"] = os.environ["UV_CACHE_DIR"]
    if online:
        return env
    env["UV_OFFLINE"] = "1"
    env["UV_HTTP_RETRIES"] = "0"
    for name in _PROXY_VARIABLES:
        env[name] = CLOSED_PROXY
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return env


def run_uv(args: list[str], *, online: bool = False, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``uv <args>`` (offline unless ``online``); a failure fails the test, saying what to run."""
    done = subprocess.run(  # type: ignore[call-overload]
        [*uv_cmd(), *args], capture_output=True, text=True, timeout=900, env=uv_env(online=online), **kwargs
    )
    hint = (
        "" if online else f"\n(uv ran offline: if a package was missing from its cache, {MAKE_INSTALL_HINT})"
    )
    assert done.returncode == 0, f"uv {args}\n{done.stdout}\n{done.stderr}{hint}"
    return done


def _stamp() -> Path:
    """Written by ``prepare`` when uv's cache holds all the wheel tests need; named by this file's
    hash too, so a change to what the tests install asks for a new ``make install``."""
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    return cache_root() / f"prepared-{recipe}.json"


def require_prepared() -> None:
    """Fail (never go online) when ``make install`` has not prepared the wheel tests."""
    stamp = _stamp()
    assert stamp.exists(), (
        f"the wheel tests' packages were never downloaded ({stamp} is missing): {MAKE_INSTALL_HINT}"
    )


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


def check_run(
    args: list[str], timeout: float | None = 900, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run ``args``; a non-zero exit fails the test with both output streams."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done


def installed_packages(python: Path) -> dict[str, str]:
    """``{name: version}`` of what is installed for ``python``."""
    out = run_uv(["pip", "list", "--format", "json", "--python", str(python)]).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def build_wheel(out: Path, source: Path = REPO, *, online: bool = False) -> Path:
    """Build the provider's wheel from ``source`` (the repository) into ``out``."""
    run_uv(["build", "--wheel", "--out-dir", str(out), str(source)], online=online)
    (built,) = out.glob("airflow_provider_onceflow-*.whl")
    return built


def build_wheel_asking_for(minor: str, work: Path, *, online: bool = False) -> Path:
    """This wheel, but declaring ``apache-airflow>=<minor>,<4`` (0.1.0 declared ``>=3.2``)."""
    source = work / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "providers", source / "providers", ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = source / "pyproject.toml"
    text, count = re.subn(
        r'"apache-airflow>=3\.\d+,<4"', f'"apache-airflow>={minor},<4"', pyproject.read_text()
    )
    assert count == 1
    pyproject.write_text(text)
    return build_wheel(work / "dist", source, online=online)


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


def plain_airflow_venv(minor: str, *, online: bool = False) -> Path:
    """A cached venv with only ``apache-airflow==<release>`` of ``minor``, resolved as of its
    release day: a cluster's Airflow before onceflow is installed. Never modified by the tests."""
    version, resolved_as_of = RELEASES[minor]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"plain-airflow-{version}"
    with open(root / f"plain-airflow-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions share the cache: one builds, one waits
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            run_uv(["venv", "--python", sys.executable, str(venv)], online=online)
            py = str(venv / "bin" / "python")
            install = ["pip", "install", "--python", py, "--exclude-newer", resolved_as_of]
            run_uv([*install, f"apache-airflow=={version}"], online=online)
            (venv / ".complete").touch()
    return venv


def airflow_venv(minor: str, wheel: Path, *, online: bool = False) -> Path:
    """The cached venv of ``minor``'s release with the wheel and all its extras (built once per
    uv.lock), with this build of the wheel put in it (only onceflow is reinstalled)."""
    version, resolved_as_of = RELEASES[minor]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"airflow-{version}"
    py = venv / "bin" / "python"
    install = ["pip", "install", "--python", str(py), "--exclude-newer", resolved_as_of]
    with open(root / f"airflow-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions share the cache: one builds, one waits
        if not (venv / ".complete").exists():  # a venv killed half-way is built again
            shutil.rmtree(venv, ignore_errors=True)
            run_uv(["venv", "--python", sys.executable, str(venv)], online=online)
            run_uv([*install, f"apache-airflow=={version}", f"{wheel}[all]"], online=online)
            (venv / ".complete").touch()
        else:
            reinstall = ["--reinstall-package", PROVIDER]
            run_uv([*install, *reinstall, f"apache-airflow=={version}", f"{wheel}[all]"], online=online)
            # onceflow alone compiled (prepare compiled the rest): seconds, not the whole venv
            site = check_run(
                [str(py), "-c", "import onceflow, os; print(os.path.dirname(onceflow.__file__))"],
                env=clean_env(),
            )
            check_run([str(py), "-m", "compileall", "-q", site.stdout.strip()], env=clean_env())
    return venv


def compile_venv(venv: Path) -> None:
    """Write every module's bytecode once: with PYTHONDONTWRITEBYTECODE (set where the tests run)
    each process in the venv would otherwise compile Airflow from source again (seconds each)."""
    (lib,) = (venv / "lib").glob("python3*")
    compileall = [str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(lib)]
    check_run(compileall, timeout=None, env=clean_env())  # minutes on a busy machine


def prepare() -> None:
    """With the network (``make install``): everything the wheel tests' offline uv calls need.

    The same calls the tests make: the wheel built, the cached venvs of each release (plain, and
    with the wheel and its extras), the install plans of test_install_keeps_airflow (uv's dry run
    reads package metadata only), and test_wheel_install's fresh venv (today's index), installed
    once in a scratch folder so the packages land in uv's cache. Then the stamp."""
    stamp = _stamp()
    if stamp.exists():
        print(f"wheel tests: uv's cache is ready ({stamp})")
        return
    with tempfile.TemporaryDirectory(prefix="onceflow-prepare-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work / "dist", online=True)
        newer = build_wheel_asking_for("3.2", work / "newer", online=True)
        for minor, (version, _) in sorted(RELEASES.items()):
            print(f"wheel tests: Airflow {version} venvs", flush=True)
            plain = plain_airflow_venv(minor, online=True)  # not compiled: one `airflow version` per test
            compile_venv(airflow_venv(minor, wheel, online=True))
            plan = ["pip", "install", "--dry-run", "--python", str(plain / "bin" / "python")]
            run_uv([*plan, f"apache-airflow=={version}", str(wheel)], online=True)
            if minor == "3.1":  # the unpinned line, with a wheel that asks for a newer Airflow
                run_uv([*plan, str(newer)], online=True)
        scratch = work / "scratch"
        run_uv(["venv", "--python", sys.executable, str(scratch)], online=True)
        py = str(scratch / "bin" / "python")
        for requirement in (f"apache-airflow=={installed_version('apache-airflow')}", str(wheel), "pytest"):
            run_uv(["pip", "install", "--python", py, requirement], online=True)
    stamp.write_text(json.dumps({"releases": RELEASES}))
    print(f"wheel tests: uv's cache is ready ({stamp})")


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


if __name__ == "__main__":
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python tests/acceptance/wheel_env.py prepare")
    prepare()
