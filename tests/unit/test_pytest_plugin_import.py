"""The pytest plugin imports almost nothing in a project that does not use it.

pytest loads ``onceflow.testing.pytest_plugin`` by its entry point in every session of every
project where onceflow is installed. A foreign project's ``pytest --co`` is run here twice, with
the plugin and with ``-p no:onceflow``, and the modules present when collection finishes are
compared: the plugin may add only its own small modules, never SQLAlchemy, Airflow, pandas, the
emulators or an HTTP client. (Counts, not timings: the time is measured side by side in
``benchmarks/bench_pytest_plugin_import.py``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

COUNT_MODULES = """
import sys, json
import pytest

class Count:
    def pytest_collection_finish(self, session):
        print("MODULES " + json.dumps(sorted(sys.modules)))

sys.exit(pytest.main(["--co", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Count()]))
"""

FOREIGN_TEST = "def test_it():\n    assert True\n"

#: What the plugin may add: its one module (and the two packages above it), which imports only
#: pytest and the standard library at module level; the modules that serve its fixtures are
#: imported when a test uses one.
ALLOWED = {"onceflow", "onceflow.testing", "onceflow.testing.pytest_plugin"}


def _modules(folder: Path, *args: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ONCEFLOW", "PYTEST"))}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", COUNT_MODULES, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = next((line for line in done.stdout.splitlines() if line.startswith("MODULES ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    return set(json.loads(line[len("MODULES ") :]))


def test_a_foreign_projects_session_loads_only_the_plugins_own_modules(tmp_path: Path) -> None:
    (tmp_path / "test_foreign.py").write_text(FOREIGN_TEST)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "foreign"\nversion = "0"\n')
    with_plugin = _modules(tmp_path)
    without = _modules(tmp_path, "-p", "no:onceflow")
    assert "onceflow.testing.pytest_plugin" in with_plugin  # the entry point did load it
    added = with_plugin - without
    assert added <= ALLOWED, sorted(added - ALLOWED)


def test_the_guards_variable_is_spelt_as_the_guard_spells_it() -> None:
    from onceflow.testing import network_guard, pytest_plugin

    assert pytest_plugin.GUARD_ENV_ENABLED == network_guard.ENV_ENABLED
