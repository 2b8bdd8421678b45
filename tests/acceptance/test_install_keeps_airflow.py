"""The documented install never moves the cluster's Airflow.

A cluster's Airflow is stood in for by a venv with only ``apache-airflow==<release>`` of each
supported minor, resolved as of its release day (``wheel_env.plain_airflow_venv``). The README's
install line is run **as written**, by bash, with ``airflow`` from that venv on ``PATH``, the
package name replaced by the wheel built here, and ``pip`` a shell function that asks uv's
resolver for a plan (``uv pip install --dry-run --python <venv>``, against today's index as
``make install`` cached it, as a user's pip would resolve; uv runs offline here). uv stands in for pip: both keep an installed distribution that
satisfies every requirement and both obey ``==``. Nothing is installed, so the cached venvs stay
plain.

* With the wheel as it is, the plan installs the provider and leaves Airflow, its core and its
  Task SDK alone, on every supported minor.
* With a wheel that asks for a newer Airflow than the cluster has (what a 3.1.8 cluster met when
  0.1.0 declared ``>=3.2``), the unpinned line would upgrade Airflow; the documented line refuses
  with a resolution error and plans nothing. Put the unpinned line back into the README and this
  test fails.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from wheel_env import (
    AIRFLOW_DISTRIBUTIONS,
    PROVIDER,
    RELEASES,
    REPO,
    build_wheel_asking_for,
    plain_airflow_venv,
    planned_changes,
    uv_cmd,
    uv_env,
)

UNPINNED = "pip install airflow-provider-onceflow"


def documented_install_line() -> str:
    """The first ``pip install`` line of the README's "Install into an existing Airflow"."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Install into an existing Airflow", 1)[1]
    line = next(line for line in section.splitlines() if line.startswith("pip install"))
    return line.split("  #", 1)[0].strip()


def plan(line: str, venv: Path, wheel: Path) -> subprocess.CompletedProcess[str]:
    """Run ``line`` in bash against ``venv``, ``pip`` answering with uv's dry-run plan."""
    assert PROVIDER in line, line
    command = line.replace(PROVIDER, str(wheel))
    uv = " ".join(uv_cmd())
    script = f'pip() {{ shift; {uv} pip install --dry-run --python "{venv}/bin/python" "$@"; }}\n{command}\n'
    offline = uv_env()  # the plan reads uv's cache only (make install filled it), never an index
    env = {**offline, "PATH": f"{venv / 'bin'}:{offline['PATH']}", "AIRFLOW_HOME": str(venv / "home")}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def wheel_asking_for_newer_airflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This wheel, but declaring ``apache-airflow>=3.2,<4`` (as 0.1.0 did)."""
    return build_wheel_asking_for("3.2", tmp_path_factory.mktemp("newer"))


def test_the_readme_pins_the_installed_airflow() -> None:
    line = documented_install_line()
    assert '"apache-airflow==$(airflow version)"' in line, line


@pytest.mark.parametrize("minor", sorted(RELEASES))
def test_the_documented_install_keeps_airflow(minor: str, wheel: Path) -> None:
    venv = plain_airflow_venv(minor)
    done = plan(documented_install_line(), venv, wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    changes = planned_changes(done.stderr + done.stdout)
    assert changes.get(PROVIDER, (None, None))[1], done.stderr[-3000:]
    moved = {name: changes[name] for name in AIRFLOW_DISTRIBUTIONS if name in changes}
    assert moved == {}, f"Airflow {RELEASES[minor][0]} would change: {moved}"


def test_the_documented_install_refuses_rather_than_move_airflow(
    wheel_asking_for_newer_airflow: Path,
) -> None:
    venv = plain_airflow_venv("3.1")
    # the defect: the unpinned line replaces the cluster's Airflow 3.1.8
    unpinned = plan(UNPINNED, venv, wheel_asking_for_newer_airflow)
    assert unpinned.returncode == 0, unpinned.stderr[-3000:]
    moved = planned_changes(unpinned.stderr + unpinned.stdout)
    assert (
        moved["apache-airflow"][0] == RELEASES["3.1"][0] and moved["apache-airflow"][1] != RELEASES["3.1"][0]
    )
    # the documented line: no solution, nothing planned
    pinned = plan(documented_install_line(), venv, wheel_asking_for_newer_airflow)
    assert pinned.returncode != 0
    assert "No solution found" in pinned.stderr, pinned.stderr[-3000:]
    assert planned_changes(pinned.stderr + pinned.stdout) == {}
