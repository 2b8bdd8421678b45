"""The built wheel installed into a plain Airflow: it adds nothing but itself, changes no package
Airflow installed, registers as a provider, every operator imports, its CLI and its ledger
migrations run, and its pytest plugin loads and serves fixtures.

"Plain" means ``pip install apache-airflow==<the locked version>`` alone: none of the other
packages of our lock, so nothing the provider needs can come in by accident.
"""

from __future__ import annotations

import json
import sys
import zipfile
from importlib.metadata import version as installed_version
from pathlib import Path

from wheel_env import PROVIDER, REPO, check_run, clean_env, installed_packages, run_uv

# Prints {module: [operator class names]} for every module get_provider_info lists as an
# operator or sensor module, imported in that environment.
IMPORT_OPERATORS = """
import importlib, inspect, json
from airflow.sdk import BaseOperator
from onceflow.get_provider_info import get_provider_info
info = get_provider_info()
found = {}
for kind in ("operators", "sensors"):
    for group in info[kind]:
        for name in group["python-modules"]:
            module = importlib.import_module(name)
            found[name] = sorted(
                n for n, obj in vars(module).items()
                if inspect.isclass(obj) and issubclass(obj, BaseOperator) and obj.__module__ == name
            )
print(json.dumps(found))
"""

# A feature whose extra is missing says which extra to install, where the task log shows it.
MISSING_EXTRAS = """
import json
from onceflow.extras import MissingExtra
from onceflow.operators.dashboard import SalesDashboardOperator
said = {}
try:
    import onceflow.hooks.sheets
except MissingExtra as exc:
    said["sheets"] = str(exc)
try:
    SalesDashboardOperator(task_id="dashboard").execute({})
except MissingExtra as exc:
    said["dashboard"] = str(exc)
print(json.dumps(said))
"""

PLUGIN_TEST = """
def test_the_plugin_serves_its_fixtures(onceflow_fake_clock, onceflow_free_port):
    start = onceflow_fake_clock.now()
    onceflow_fake_clock.advance(5)
    assert onceflow_fake_clock.now() == start + 5
    assert 1024 < onceflow_free_port < 65536
"""


def test_wheel_carries_code_sql_migrations_and_entry_points(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "onceflow/get_provider_info.py" in names
    assert "onceflow/py.typed" in names
    assert "onceflow/testing/pytest_plugin.py" in names
    package = REPO / "providers" / "onceflow"
    data = {
        str(p.relative_to(REPO / "providers")) for p in package.rglob("*") if p.suffix in (".sql", ".mako")
    }
    revisions = {
        str(p.relative_to(REPO / "providers"))
        for p in (package / "ledger" / "migrations" / "versions").glob("*.py")
    }
    assert "onceflow/ledger/migrations/env.py" in names
    assert "onceflow/ledger/migrations/script.py.mako" in data
    assert len(revisions) >= 4
    assert data | revisions <= names
    assert not any(n.startswith(("tests/", "dags/", "benchmarks/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[apache_airflow_provider]" in text
    assert "onceflow.get_provider_info:get_provider_info" in text
    assert "[pytest11]" in text
    assert "onceflow = onceflow.cli:main" in text


def test_wheel_installs_into_a_plain_airflow_adding_only_itself(wheel: Path, tmp_path: Path) -> None:
    env = clean_env()
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    run_uv(["venv", "--python", sys.executable, str(venv)])
    airflow = (
        f"apache-airflow=={installed_version('apache-airflow')}"  # the locked one (make installs the lock)
    )
    run_uv(["pip", "install", "--python", str(py), airflow])
    before = installed_packages(py)
    assert "pandas" not in before and "apache-airflow-providers-google" not in before

    run_uv(["pip", "install", "--python", str(py), str(wheel)])

    after = installed_packages(py)
    assert set(after) - set(before) == {PROVIDER}
    changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
    assert changed == {}  # no downgrade (python-dateutil, tenacity, importlib-metadata...), no upgrade

    run_env = {**env, "AIRFLOW_HOME": str(tmp_path / "home")}
    get = check_run([str(venv / "bin" / "airflow"), "providers", "get", PROVIDER], env=run_env)
    assert PROVIDER in get.stdout

    imported = json.loads(check_run([str(py), "-c", IMPORT_OPERATORS], env=run_env).stdout.splitlines()[-1])
    expected = json.loads(
        check_run([sys.executable, "-c", IMPORT_OPERATORS], env=run_env).stdout.splitlines()[-1]
    )
    assert imported == expected
    assert {"PartitionOverwriteOperator", "SheetClaimOperator", "NewRowsSensor"} <= {
        name for names in imported.values() for name in names
    }

    said = json.loads(check_run([str(py), "-c", MISSING_EXTRAS], env=run_env).stdout.splitlines()[-1])
    assert said == {
        "sheets": "the Sheet queue (Airflow's GSheetsHook) needs 'airflow.providers.google', which is not installed: "
        "pip install 'airflow-provider-onceflow[sheets]'",
        "dashboard": "the sales dashboard's chart needs 'matplotlib', which is not installed: "
        "pip install 'airflow-provider-onceflow[dashboard]'",
    }

    version = check_run([str(venv / "bin" / "onceflow"), "version"], env=run_env)
    import onceflow

    assert version.stdout.strip() == onceflow.__version__
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade = check_run(
        [str(venv / "bin" / "onceflow"), "ledger", "upgrade", "--url", ledger_url], env=run_env
    )
    assert upgrade.stdout.splitlines()[-1].startswith("created the ledger's tables at revision ledger_v")

    # pytest is not a dependency of the provider (a cluster does not need it): a user who tests
    # their DAGs installs it, and then the plugin loads by its entry point, with no -p flag.
    run_uv(["pip", "install", "--python", str(py), "pytest"])
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_plugin.py").write_text(PLUGIN_TEST)
    plugin = check_run(
        [str(py), "-m", "pytest", "-p", "no:cacheprovider", "-v", "--trace-config", "test_plugin.py"],
        env=run_env,
        cwd=suite,
    )
    assert "onceflow.testing.pytest_plugin" in plugin.stdout
    assert "test_the_plugin_serves_its_fixtures PASSED" in plugin.stdout
