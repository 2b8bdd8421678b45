"""Docstrings are the reference's source: every public module, class and function has one.

Scope: exactly the public names of ``providers/onceflow/`` outside ``testing/`` (the definition in
``docs/_build/public_api.py``), plus the public methods those classes define. A method that
overrides a documented method of a base class (``execute``, ``serialize``, ``poke``...) inherits
that docstring, as ``inspect.getdoc`` and the reference do.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from typing import Any

from docs_site import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "docs" / "_build"))

import public_api
import reference_tables


def _inherited_doc(cls: Any, name: str) -> str | None:
    for base in getattr(cls, "__mro__", ())[1:]:
        if name in vars(base):
            return inspect.getdoc(getattr(base, name, None))
    return None


def undocumented() -> list[str]:
    """``module.Name`` (or ``module.Class.method``) of every public definition with no docstring."""
    missing = []
    for module in public_api.public_modules(REPO_ROOT):
        if not ast.get_docstring(module.tree):
            missing.append(f"{module.name} (module)")
        try:
            imported = importlib.import_module(module.name)
        except Exception:  # Alembic's env.py runs only inside Alembic: its source is enough
            imported = None
        for node in public_api.public_definitions(module):
            if not ast.get_docstring(node):
                missing.append(f"{module.name}.{node.name}")
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(imported, node.name, None)
            for method in public_api.public_methods(node):
                if not ast.get_docstring(method) and not _inherited_doc(cls, method.name):
                    missing.append(f"{module.name}.{node.name}.{method.name}")
    return missing


def test_every_public_module_class_and_function_outside_testing_has_a_docstring() -> None:
    assert undocumented() == []


def test_every_environment_variable_and_airflow_variable_the_code_reads_is_described() -> None:
    env, variables = reference_tables.environment(REPO_ROOT)
    assert {"ONCEFLOW_SALES_TABLE", "ONCEFLOW_TEST_DATABASE_URL"} <= {s.name for s in env}
    assert [s.name for s in env + variables if not s.description] == []
