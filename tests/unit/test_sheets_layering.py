"""The sheet queue's modules call down only: no import circle inside ``onceflow/sheets/`` (issue 22).

Every import counts, also those under ``TYPE_CHECKING`` and inside functions: a module that names
another only for its types still depends on its shape. Before the split, ``protocol.py``,
``settle.py``, ``anchored.py`` and ``audit.py`` imported each other in a circle, and a row's
write-back went through ``protocol.py`` six times.
"""

from __future__ import annotations

import ast
from pathlib import Path

import onceflow.sheets

PACKAGE = Path(onceflow.sheets.__file__).parent
PREFIX = "onceflow.sheets"


def sheets_imports(source: str) -> set[str]:
    """The ``onceflow.sheets`` modules one module's source imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PREFIX:
                found |= {alias.name for alias in node.names}
            elif node.module.startswith(PREFIX + "."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX + "."):
                    found.add(alias.name.split(".")[2])
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return {m: sheets_imports((package / f"{m}.py").read_text()) & modules - {m} for m in modules}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_of_the_sheet_queue_imports_one_that_imports_it_back() -> None:
    graph = import_graph(PACKAGE)
    assert {"protocol", "claim", "settle", "anchored", "tab", "relay"} <= set(graph)
    assert circles(graph) == []


def test_the_jobs_call_down_into_the_tab_and_the_row_model_never_up_into_the_queue() -> None:
    graph = import_graph(PACKAGE)
    below_the_queue = ["tab", "anchored", "audit", "claim", "settle", "relay", "model", "transport"]
    upward = {m: graph[m] & {"protocol", "wakeup", "reconcile"} for m in below_the_queue}
    assert upward == {m: set() for m in below_the_queue}
    assert graph["model"] <= {"keys"} and graph["transport"] <= {"retry", "service"}
    assert graph["service"] == set()  # the shared API resources: nothing of the queue


def test_protocol_py_is_under_400_lines() -> None:
    assert len((PACKAGE / "protocol.py").read_text().splitlines()) < 400


def test_the_circle_finder_finds_a_circle() -> None:
    """The check can fail: the old ``protocol`` -> ``settle`` -> ``protocol`` is a circle, and so
    is an import made only under ``TYPE_CHECKING``."""
    old = "from onceflow.sheets import anchors, settle\n"
    typed = "if TYPE_CHECKING:\n    from onceflow.sheets.protocol import SheetQueue\n"
    assert sheets_imports(old) == {"anchors", "settle"} and sheets_imports(typed) == {"protocol"}
    assert circles({"protocol": {"settle"}, "settle": {"protocol"}, "model": set()}) == [
        ["protocol", "settle"]
    ]
