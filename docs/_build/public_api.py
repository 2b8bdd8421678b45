"""The public modules and names of ``providers/onceflow/`` outside ``testing/``, read with ``ast``.

A module is public when no part of its path starts with ``_`` (``__init__`` and ``__main__``
excepted); a name is public when it is defined at the module's top level (``class``, ``def``,
an assignment) and does not start with ``_``. Imported names are not the module's own: they are
documented where they are defined. The reference (``reference.py``) renders one section per public
module; ``tests/docs`` checks that each public name is in the built reference and has a docstring.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "onceflow"
EXCLUDED = ("testing",)


@dataclass(frozen=True)
class PublicModule:
    """One public module: its dotted name, its file, and its parsed source."""

    name: str
    path: Path
    tree: ast.Module

    @property
    def group(self) -> str:
        """The reference page it belongs to: its subpackage, or ``onceflow`` for a top-level module."""
        parts = self.name.split(".")
        if len(parts) == 1 or (len(parts) == 2 and self.path.name != "__init__.py"):
            return PACKAGE
        return parts[1]


def package_dir(repo_root: Path) -> Path:
    """``providers/onceflow`` of the repository at ``repo_root``."""
    return repo_root / "providers" / PACKAGE


def public_modules(repo_root: Path) -> list[PublicModule]:
    """Every public module of the package outside ``testing/``, in path order."""
    root = package_dir(repo_root)
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in EXCLUDED or "__pycache__" in rel.parts:
            continue
        if any(p.startswith("_") and p not in ("__init__.py", "__main__.py") for p in rel.parts):
            continue
        # A folder without __init__.py (Alembic's versions/) is not importable as a package.
        if any(
            not (root.joinpath(*rel.parts[:i]) / "__init__.py").is_file() for i in range(1, len(rel.parts))
        ):
            continue
        parts = [PACKAGE, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found.append(PublicModule(".".join(parts), path, ast.parse(path.read_text(encoding="utf-8"))))
    return found


def _assigned(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def public_definitions(module: PublicModule) -> list[ast.stmt]:
    """The module's public top-level classes and functions (including under ``if``/``try``)."""
    return [
        n
        for n in _top_level(module.tree.body)
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
    ]


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level(node.body)
        else:
            out.append(node)
    return out


def public_names(module: PublicModule) -> list[str]:
    """Every public name the module defines, in source order, without repeats."""
    names: list[str] = []
    for node in _top_level(module.tree.body):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            candidates = [node.name]
        else:
            candidates = _assigned(node)
        names += [n for n in candidates if not n.startswith("_") and n not in names and n != "TYPE_CHECKING"]
    return names


def public_methods(cls: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The public methods (and properties) a class body defines."""
    return [
        n
        for n in cls.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
    ]


def first_line(node: ast.AST) -> str:
    """The first line of a node's docstring, or ``""``."""
    doc = (
        ast.get_docstring(node)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        else None
    )
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ")
