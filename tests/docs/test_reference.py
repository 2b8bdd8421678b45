"""The reference is generated from the code and covers every public name of the package.

Scope: the public modules of ``providers/onceflow/`` outside ``testing/`` (``docs/_build/public_api.py``:
no path part starting with ``_``; names defined at the module's top level, not starting with ``_``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from docs_site import REPO_ROOT, parse_page

sys.path.insert(0, str(REPO_ROOT / "docs" / "_build"))

import public_api
import reference_tables

# The connections of the design card (shared/DESIGN.md), plus the fetch allow-list.
DESIGN_CONNECTIONS = {
    "onceflow_sheets",
    "onceflow_storage",
    "onceflow_translate",
    "onceflow_shop_db",
    "onceflow_warehouse",
    "onceflow_ledger",
    "onceflow_fetch",
}


def test_every_public_name_outside_testing_has_an_anchor_in_the_built_reference(site_dir: Path) -> None:
    modules = public_api.public_modules(REPO_ROOT)
    assert len(modules) > 50 and not any(".testing" in m.name for m in modules)
    missing = []
    ids_by_page: dict[str, set[str]] = {}
    for module in modules:
        page = site_dir / "reference" / "api" / f"{module.group}.html"
        if page.name not in ids_by_page:
            ids_by_page[page.name] = parse_page(page)[0] if page.is_file() else set()
        ids = ids_by_page[page.name]
        for name in [module.name, *(f"{module.name}.{n}" for n in public_api.public_names(module))]:
            if name not in ids:
                missing.append(f"{name} (expected on reference/api/{page.name})")
    assert missing == []


def test_the_reference_overview_lists_each_hook_operator_sensor_trigger_notifier_and_plugin(
    site_dir: Path,
) -> None:
    _, links = parse_page(site_dir / "reference" / "index.html")
    for expected in (
        "api/hooks.html#onceflow.hooks.sheets.SheetQueueHook",
        "api/operators.html#onceflow.operators.partition.PartitionOverwriteOperator",
        "api/sensors.html#onceflow.sensors.sheets.NewRowsSensor",
        "api/triggers.html#onceflow.triggers.sheets.NewRowsTrigger",
        "api/notifications.html#onceflow.notifications.deadline.MissedDeadlineNotifier",
        "api/onceflow.html#onceflow.priority.OnceflowPriorityPlugin",
    ):
        assert expected in links


def test_every_connection_of_the_design_is_in_the_connections_reference(site_dir: Path) -> None:
    assert {c.conn_id for c in reference_tables.connections(REPO_ROOT)} >= DESIGN_CONNECTIONS
    ids, _ = parse_page(site_dir / "reference" / "connections.html")
    assert ids >= DESIGN_CONNECTIONS


def test_the_command_line_reference_has_every_command_of_both_scripts(site_dir: Path) -> None:
    text = (site_dir / "reference" / "cli.html").read_text(encoding="utf-8")
    for command in (
        "onceflow up",
        "onceflow pools",
        "onceflow ledger upgrade",
        "onceflow sales",
        "onceflow-watchdog",
    ):
        assert f"<code>{command}" in text, command
    assert "usage: onceflow-watchdog [-h] --config CONFIG" in text


def test_the_environment_scan_finds_variables_in_code_comments_and_dag_docs(tmp_path: Path) -> None:
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "d.py").write_text(
        '"""A DAG.\n\nSet `ONCEFLOW_FOO_DIR` to the folder the report goes to.\n"""\n'
        'import os\nBAR = os.environ.get("ONCEFLOW_BAR")\nCONN = "AIRFLOW_CONN_ONCEFLOW_SHEETS"\n'
    )
    env, _ = reference_tables.environment(tmp_path)
    assert [(s.name, s.description) for s in env] == [
        ("ONCEFLOW_BAR", ""),
        ("ONCEFLOW_FOO_DIR", "Set `ONCEFLOW_FOO_DIR` to the folder the report goes to."),
    ]


def _dynamic_env_names(source: str) -> list[str]:
    """Strings that build an ``ONCEFLOW_*`` name at run time (the reference's scan sees only whole names)."""
    import ast
    import re

    name = re.compile(r"(?<![A-Za-z0-9_])ONCEFLOW_[A-Z0-9_]*")
    found: dict[int, str] = {}  # by node: ast.walk meets an f-string's parts twice

    def check(node: ast.expr, continued: bool) -> None:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return
        for m in name.finditer(text := node.value):
            rest = text[m.end() : m.end() + 1]
            if rest == "*":  # prose about the family: ``ONCEFLOW_*``
                continue
            if m.group(0).endswith("_") or rest in ("{", "%") or (continued and m.end() == len(text)):
                found[id(node)] = text

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            for part, after in zip(node.values, [*node.values[1:], None], strict=True):
                check(part, continued=after is not None)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
            check(node.left, continued=True)
        elif isinstance(node, ast.Constant):
            check(node, continued=False)
    return list(found.values())


def test_the_dynamic_name_guard_sees_names_built_at_run_time() -> None:
    built = 'import os\nk = "X"\nos.environ.get(f"ONCEFLOW_{k}_DIR")\nos.environ["ONCEFLOW_SALES" + k]\n'
    built += 'os.getenv("ONCEFLOW_%s" % k)\nos.getenv("ONCEFLOW_{}".format(k))\n'
    assert len(_dynamic_env_names(built)) == 4
    whole = (
        'import os\nos.environ.get("ONCEFLOW_BAR")\nX = f"ONCEFLOW_BAR={1}"\n"""the ``ONCEFLOW_*`` ones"""\n'
    )
    assert _dynamic_env_names(whole) == []


def test_no_onceflow_environment_variable_name_is_built_at_run_time() -> None:
    """Every ``ONCEFLOW_*`` name is written out whole in the source, so the reference's scan finds it."""
    found = {
        path.relative_to(REPO_ROOT).as_posix(): names
        for path in sorted((REPO_ROOT / "providers").rglob("*.py"))
        if (names := _dynamic_env_names(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_every_onceflow_variable_in_the_package_is_in_the_built_settings_page(site_dir: Path) -> None:
    """Checked against the built page with a scan of its own (the strings of the syntax tree), not
    the generator's text scan, so a name the generator missed fails here."""
    import ast
    import re

    name = re.compile(r"(?<![A-Za-z0-9_])ONCEFLOW_[A-Z0-9][A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_])")
    names = {
        m.group(0)
        for path in (REPO_ROOT / "providers").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for m in name.finditer(node.value)
    }
    assert "ONCEFLOW_BUSINESS_TZ" in names  # the scan works
    conn_ids = {c.conn_id.upper() for c in reference_tables.connections(REPO_ROOT)}
    page = (site_dir / "reference" / "settings.html").read_text(encoding="utf-8")
    assert sorted(n for n in names - conn_ids if f"<code>{n}</code>" not in page) == []
