"""The reference, generated from the code at every build: nothing here is written by hand.

- ``reference/api/<group>.md``: one page per subpackage, one mkdocstrings section per public module
  (``public_api.py``), so every public class, function and constant has an anchor;
- ``reference/index.md``: the hooks, operators, sensors, triggers, notifiers and plugins with their
  parameters, read from the source;
- ``reference/connections.md``, ``reference/settings.md``, ``reference/cli.md`` and
  ``reference/watchdog-config.md`` (``reference_tables.py``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import public_api
import reference_tables
from mkdocs.config.defaults import MkDocsConfig

API_DIR = "reference/api"
GROUP_TITLES = {
    "onceflow": "Top-level modules",
    "hooks": "Hooks",
    "operators": "Operators",
    "sensors": "Sensors",
    "triggers": "Triggers",
    "notifications": "Notifications",
    "sheets": "Sheet queue (domain)",
    "articles": "Article chain (domain)",
    "ledger": "Work ledger",
    "sales": "Daily sales (domain)",
    "watchdog": "Watchdog",
    "opsview": "Operations view",
}
TABLE_PAGES = {
    "Connections": "reference/connections.md",
    "Settings and environment variables": "reference/settings.md",
    "Watchdog configuration": "reference/watchdog-config.md",
    "Command line": "reference/cli.md",
}

# (title, folder or module, how a class of that kind is recognised by its bases or name)
KINDS = (
    ("Hooks", "hooks", ("Hook",)),
    ("Operators", "operators", ("Operator",)),
    ("Sensors", "sensors", ("Sensor",)),
    ("Triggers", "triggers", ("Trigger",)),
    ("Notifiers", "notifications", ("Notifier",)),
    ("Plugins and scheduler extensions", "", ("AirflowPlugin", "WeightStrategy", "DeadlineReference")),
)


def _groups(repo_root: Path) -> dict[str, list[public_api.PublicModule]]:
    groups: dict[str, list[public_api.PublicModule]] = {}
    for module in public_api.public_modules(repo_root):
        groups.setdefault(module.group, []).append(module)
    order = list(GROUP_TITLES)
    return dict(sorted(groups.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0])))


def extend_nav(config: MkDocsConfig) -> None:
    """Replace the nav's ``Reference`` entry with the generated pages."""
    repo_root = Path(config["config_file_path"]).resolve().parent
    section: list[Any] = [{"Overview": "reference/index.md"}]
    section += [{title: uri} for title, uri in TABLE_PAGES.items()]
    section.append(
        {"API": [{GROUP_TITLES.get(g, g): f"{API_DIR}/{g}.md"} for g in _groups(repo_root)]},
    )
    nav = config["nav"] or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and "Reference" in item:
            nav[i] = {"Reference": section}


def api_anchor(module: str, name: str, group: str, from_dir: str = "reference") -> str:
    """The link from a page in ``from_dir`` to ``module.name`` on its API page."""
    rel = "api/" if from_dir == "reference" else ""
    return f"{rel}{group}.md#{module}.{name}"


def _api_page(group: str, modules: list[public_api.PublicModule]) -> str:
    out = [f"# {GROUP_TITLES.get(group, group)}\n\n"]
    out.append("| module | what it is |\n|---|---|\n")
    for m in modules:
        out.append(f"| [`{m.name}`](#{m.name}) | {_cell(public_api.first_line(m.tree))} |\n")
    out.append("\n")
    for m in modules:
        out.append(f"::: {m.name}\n\n")
    return "".join(out)


def _cell(text: str) -> str:
    text = re.sub(r":(?:class|meth|func|attr|mod|data|exc):`~?([^`]+)`", r"`\1`", text)
    return text.replace("|", "\\|").replace("``", "`").strip()


@dataclass(frozen=True)
class Component:
    """A class of one of the ``KINDS``: where it is and its constructor's parameters."""

    module: public_api.PublicModule
    node: ast.ClassDef

    @property
    def params(self) -> list[str]:
        """The constructor's parameters as written (``name: type = default``), ``self`` left out."""
        init = next(
            (n for n in self.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
        )
        if init is None:
            return []
        a = init.args
        out = []
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        for arg, default in zip(positional, defaults, strict=True):
            if arg.arg != "self":
                out.append(_param(arg, default))
        out += [_param(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
        if a.kwarg:
            out.append(f"**{a.kwarg.arg}")
        return out


def _param(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg
    if arg.annotation is not None:
        text += f": {ast.unparse(arg.annotation)}"
    if default is not None:
        text += f" = {ast.unparse(default)}"
    return text


def components(repo_root: Path) -> dict[str, list[Component]]:
    """The classes of each kind (title -> classes), found by folder and by base class or name."""
    found: dict[str, list[Component]] = {title: [] for title, _, _ in KINDS}
    for module in public_api.public_modules(repo_root):
        for node in public_api.public_definitions(module):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            for title, folder, marks in KINDS:
                in_folder = not folder or module.name.split(".")[1:2] == [folder]
                if in_folder and any(b.endswith(marks) or node.name.endswith(marks) for b in bases):
                    found[title].append(Component(module, node))
                    break
    return found


def _overview(repo_root: Path) -> str:
    out = [
        "# Reference\n\n",
        "Generated from the code at every build: the docstrings are the source "
        "(`tests/docs/test_docstrings.py` fails when a public class or function has none, "
        "`tests/docs/test_reference.py` when a public name is missing here).\n\n",
        "| page | what it lists |\n|---|---|\n",
        "| [Connections](connections.md) | every connection a hook reads, with its type and fields |\n",
        "| [Settings and environment variables](settings.md) | the `[onceflow]` Airflow options, "
        "the Airflow Variables, every `ONCEFLOW_*` environment variable |\n",
        "| [Watchdog configuration](watchdog-config.md) | every key of `onceflow-watchdog`'s TOML file |\n",
        "| [Command line](cli.md) | `onceflow` and `onceflow-watchdog`, every subcommand |\n",
    ]
    for group, modules in _groups(repo_root).items():
        out.append(
            f"| [{GROUP_TITLES.get(group, group)}](api/{group}.md) | "
            + ", ".join(f"`{m.name}`" for m in modules)
            + " |\n"
        )
    out.append("\n")
    for title, comps in components(repo_root).items():
        out.append(f"## {title}\n\n| class | parameters | what it does |\n|---|---|---|\n")
        for c in comps:
            link = api_anchor(c.module.name, c.node.name, c.module.group)
            params = "<br>".join(f"`{_cell(p)}`" for p in c.params) or "(none)"
            out.append(f"| [`{c.node.name}`]({link}) | {params} | {_cell(public_api.first_line(c.node))} |\n")
        out.append("\n")
    return "".join(out)


def pages(repo_root: Path) -> dict[str, str]:
    """Every generated reference page (uri relative to docs/ -> Markdown)."""
    out = {"reference/index.md": _overview(repo_root)}
    for group, modules in _groups(repo_root).items():
        out[f"{API_DIR}/{group}.md"] = _api_page(group, modules)
    out.update(reference_tables.pages(repo_root))
    return out
