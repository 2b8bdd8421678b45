"""``onceflow.ledger`` loads its parts on first use: a task that only needs one submodule pays for one.

daily_sales' extract needs the ledger's engine rules (``onceflow.ledger.db``, through
``onceflow.sales.engine``) but never the ledger itself; importing the package used to import the
whole ledger (core, commits, items, schema: about 10 ms of CPU per task process without the
preload, issue 27).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import onceflow.ledger

PROVIDERS = Path(onceflow.ledger.__file__).resolve().parents[2]


def fresh_modules(statement: str) -> set[str]:
    """The onceflow modules a fresh interpreter holds after ``statement``."""
    code = (
        f"import json, sys; {statement}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('onceflow'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PROVIDERS), "PATH": "/usr/bin:/bin"},
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_engine_rules_come_without_the_ledger() -> None:
    loaded = fresh_modules("import onceflow.sales.engine")
    assert "onceflow.ledger.db" in loaded
    assert not {"onceflow.ledger.core", "onceflow.ledger.commit", "onceflow.ledger.schema"} & loaded


def test_a_name_from_the_package_loads_its_home() -> None:
    loaded = fresh_modules("from onceflow.ledger import Ledger")
    assert "onceflow.ledger.core" in loaded


@pytest.mark.parametrize("name", onceflow.ledger.__all__)
def test_every_exported_name_is_its_home_modules_object(name: str) -> None:
    value = getattr(onceflow.ledger, name)
    home = importlib.import_module(onceflow.ledger._HOMES[name].join(("onceflow.ledger.", "")))
    assert value is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Leger'"):
        onceflow.ledger.Leger  # noqa: B018
    with pytest.raises(ImportError):
        exec("from onceflow.ledger import Leger", {})


def test_the_exports_the_homes_and_the_typed_imports_name_the_same_things() -> None:
    """A name in ``__all__`` but not in ``_HOMES`` would fail at first use; one missing from the
    TYPE_CHECKING imports would type-check as ``Any`` everywhere (the module ``__getattr__`` hides it
    from mypy and ruff), so the three lists are compared here."""
    import ast

    tree = ast.parse(Path(onceflow.ledger.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module is not None
                for alias in stmt.names:
                    typed[alias.asname or alias.name] = stmt.module.removeprefix("onceflow.ledger.")
    homes = onceflow.ledger._HOMES
    assert set(onceflow.ledger.__all__) == set(homes) == set(typed)
    assert typed == homes
