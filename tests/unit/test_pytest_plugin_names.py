"""The auto-loaded pytest plugin adds only ``onceflow_``-prefixed fixtures to a user's test suite.

``pytest --fixtures`` runs in an empty folder outside this repository (so tests/conftest.py's
short aliases are not loaded): what it lists under onceflow's modules is what every test suite
of a cluster that installs the provider sees.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SECTION = re.compile(r"^-+ fixtures defined from (\S+) -+$")
NAME = re.compile(r"^(\w+)( \[\w+ scope\])? -- ")

# Every fixture the plugin serves, by its public name (docs/testing.md lists the same ones).
EXPECTED = {
    "onceflow_airflow_env",
    "onceflow_airflow_db",
    "onceflow_run_dag",
    "onceflow_airflow_cluster_factory",
    "onceflow_airflow_cluster",
    "onceflow_postgres_url_factory",
    "onceflow_postgres_url",
    "onceflow_free_port",
    "onceflow_sheets_emulator",
    "onceflow_sheets_emulator_factory",
    "onceflow_queue_sheet",
    "onceflow_fake_clock",
    "onceflow_ledger_url",
    "onceflow_ledger",
    "onceflow_sqlite_ledger",
    "onceflow_sales_db_url",
    "onceflow_shop_orders",
    "onceflow_sales_connections",
    "onceflow_article_site",
    "onceflow_fake_gcs",
    "onceflow_network_refusals",
}


def _plugin_fixtures(folder: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fixtures"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: no tests collected
    found: set[str] = set()
    module = ""
    for line in done.stdout.splitlines():
        if m := SECTION.match(line):
            module = m.group(1)
        elif module.startswith("onceflow.") and (m := NAME.match(line)):
            found.add(m.group(1))
    return found


def test_plugin_fixtures_are_all_prefixed(tmp_path: Path) -> None:
    found = _plugin_fixtures(tmp_path)
    assert found == EXPECTED


def test_the_docs_list_every_plugin_fixture() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    missing = sorted(name for name in EXPECTED if f"`{name}`" not in docs)
    assert missing == []


def test_this_repository_keeps_its_short_aliases(
    free_port: int,
    onceflow_free_port: int,
    fake_clock: object,
    onceflow_fake_clock: object,
    ledger: object,
    onceflow_ledger: object,
) -> None:
    # tests/conftest.py: the same objects as the prefixed fixtures, for this suite only; `ledger`
    # keeps the plugin's parametrisation over SQLite and PostgreSQL
    assert free_port == onceflow_free_port
    assert fake_clock is onceflow_fake_clock
    assert ledger is onceflow_ledger
