"""Reference pages read from the code: connections, settings and environment variables, the CLI, the
watchdog's configuration keys. Each table is scanned or imported at build time, so it follows the code.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import public_api

CONN_FIELDS = ("host", "login", "password", "port", "schema")


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("|", "\\|").replace("``", "`")).strip()


# ---------------------------------------------------------------- connections


@dataclass
class Connection:
    """One connection id and what the code reads from it."""

    conn_id: str
    conn_type: str
    hooks: list[tuple[str, str, str]] = field(default_factory=list)  # (module, class, hook_name)
    fields: set[str] = field(default_factory=set)
    extras: set[str] = field(default_factory=set)
    doc: str = ""
    module_docs: dict[str, str] = field(default_factory=dict)


def _literal_attrs(node: ast.ClassDef) -> dict[str, Any]:
    out = {}
    for stmt in node.body:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            target, value = stmt.target.id, stmt.value
        if target and isinstance(value, ast.Constant):
            out[target] = value.value
    return out


def _reads(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Connection fields (``conn.host``...) and extra keys (``extra.get("key")``) a module reads."""
    fields, extras = set(), set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in CONN_FIELDS
            and isinstance(node.value, ast.Name)
            and "conn" in node.value.id.lower()
        ):
            fields.add(node.attr)
        key = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop")
        ):
            if "extra" in ast.unparse(node.func.value).lower() and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and "extra" in ast.unparse(node.value).lower():
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            extras.add(key.value)
    return fields, extras


def connections(repo_root: Path) -> list[Connection]:
    """Every connection id that a hook class names as its ``default_conn_name``."""
    found: dict[str, Connection] = {}
    for module in public_api.public_modules(repo_root):
        classes = [n for n in public_api.public_definitions(module) if isinstance(n, ast.ClassDef)]
        for node in classes:
            attrs = _literal_attrs(node)
            conn_id = attrs.get("default_conn_name")
            if not isinstance(conn_id, str):
                continue
            conn = found.setdefault(conn_id, Connection(conn_id, str(attrs.get("conn_type", ""))))
            conn.hooks.append((module.name, node.name, str(attrs.get("hook_name", ""))))
            fields, extras = _reads(module.tree)
            conn.fields |= fields
            conn.extras |= extras
            conn.doc = conn.doc or (ast.get_docstring(node) or "")
            conn.module_docs[module.name] = ast.get_docstring(module.tree) or ""
    return sorted(found.values(), key=lambda c: c.conn_id)


def _connections_page(repo_root: Path) -> str:
    out = [
        "# Connections\n\n",
        "Every endpoint, credential and database is an Airflow connection (UI, `AIRFLOW_CONN_*` "
        "variables or a secrets backend). This page lists each connection id a hook reads by "
        "default, read from the hooks' source: its type, the hooks that use it, the standard fields "
        "and the `extra` keys their modules read, and the hook's own description. "
        "[Deploying](../deploy.md) shows them set for production; `make run` sets all of them for "
        "the local stack.\n\n",
        "| connection id | type | hooks | fields read | `extra` keys read |\n|---|---|---|---|---|\n",
    ]
    conns = connections(repo_root)
    for c in conns:
        hooks = "<br>".join(f"[`{cls}`](api/{_group(mod)}.md#{mod}.{cls})" for mod, cls, _ in c.hooks)
        fields = ", ".join(f"`{f}`" for f in sorted(c.fields)) or "-"
        extras = ", ".join(f"`{e}`" for e in sorted(c.extras)) or "-"
        out.append(f"| [`{c.conn_id}`](#{c.conn_id}) | `{c.conn_type}` | {hooks} | {fields} | {extras} |\n")
    seen: set[str] = set()
    for c in conns:
        names = ", ".join(name for _, _, name in c.hooks if name)
        out.append(f"\n## `{c.conn_id}` {{#{c.conn_id}}}\n\n")
        out.append(f"Type `{c.conn_type}`" + (f"; hook name(s): {names}." if names else ".") + "\n\n")
        out.append(_rst_to_md(c.doc) + "\n")
        for mod, _, _ in c.hooks:
            if mod not in seen:
                seen.add(mod)
                out.append(f"\nFrom `{mod}`:\n\n" + _rst_to_md(c.module_docs[mod]) + "\n")
    return "".join(out)


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "onceflow"


def _rst_to_md(text: str) -> str:
    text = re.sub(r"^:param (\w+):", r"- `\1`:", text, flags=re.M)
    text = re.sub(r":(?:class|meth|func|attr|mod|data|exc):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return re.sub(r"::\n", ":\n", text)


# ---------------------------------------------------------------- settings and environment

ENV_VAR = re.compile(r"(?<![A-Za-z0-9_])ONCEFLOW_[A-Z0-9][A-Z0-9_]*[A-Z0-9]")
AIRFLOW_VAR = re.compile(r"AIRFLOW_VAR_(ONCEFLOW_[A-Z0-9_]+)|Variable\W{0,4}(onceflow_[a-z0-9_]+)")
SCANNED = ("providers", "dags", "plugins", ".ci", "Makefile")


def _scanned_files(repo_root: Path) -> Iterator[Path]:
    for name in SCANNED:
        path = repo_root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", "", ".sh", ".toml"):
                    yield p


def _texts(path: Path, source: str) -> list[str]:
    """The prose of a file: its docstrings first, then its other strings (``help=``, ``doc_md``) and comments."""
    if path.suffix != ".py":
        return [line.lstrip("# ") for line in source.splitlines() if line.lstrip().startswith("#")]
    out = []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                out.append(doc)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count(" ") >= 3:
            out.append(node.value)  # help= strings, a DAG's doc_md, messages
    with contextlib.suppress(tokenize.TokenError, IndentationError):
        out += [
            t.string.lstrip("#: ")
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT
        ]
    return out


def _sentences(text: str) -> Iterator[str]:
    paragraph: list[str] = []
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith(("* ", "- ")) and paragraph:  # a list item starts a new paragraph
            yield from _split(" ".join(paragraph))
            paragraph = []
        stripped = stripped.removeprefix("* ").removeprefix("- ")
        if stripped.startswith("|") or not stripped:
            if paragraph:
                yield from _split(" ".join(paragraph))
                paragraph = []
            if stripped.startswith("|"):
                yield stripped
        else:
            paragraph.append(stripped)


def _split(paragraph: str) -> list[str]:
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.;])\s+(?=[A-Z`$(])", paragraph)


@dataclass
class Setting:
    """An environment variable or Variable: where it is read and the sentence that explains it."""

    name: str
    files: set[str] = field(default_factory=set)
    description: str = ""
    description_from: str = ""
    attached: str = ""  # the comment on or above a line that names it
    attached_from: str = ""

    @property
    def tests_only(self) -> bool:
        """Read only by ``onceflow.testing`` (the pytest plugin and the local run's helpers) or CI."""
        return all("/testing/" in f or f.startswith(".ci") for f in self.files)


def _attached_comment(lines: list[str], index: int) -> str:
    """The ``#`` comment on a line or the comment block right above it (``#:`` as Sphinx reads it)."""
    line = lines[index]
    if "#" in line and not line.lstrip().startswith("#"):
        inline = line.split("#", 1)[1].lstrip(": ").strip()
        if len(inline.split()) >= 3:
            return inline
    block: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].lstrip().startswith("#"):
        block.insert(0, lines[i].strip().lstrip("#").lstrip(": ").strip())
        i -= 1
    return " ".join(block)


def _describe(found: dict[str, Setting], texts: dict[str, list[str]]) -> None:
    # A sentence from runtime code beats one from the test harness; a longer one beats a bare mention.
    ranked = sorted(texts.items(), key=lambda kv: ("/testing/" in kv[0], kv[0]))
    for setting in found.values():
        for rel, blocks in ranked:
            candidates = [
                s for b in blocks for s in _sentences(b) if setting.name in s and len(s.split()) >= 4
            ]
            if candidates:
                setting.description = _table_row(candidates[0])
                setting.description_from = rel
                break
        if not setting.description and setting.attached:
            setting.description, setting.description_from = setting.attached, setting.attached_from


def _table_row(sentence: str) -> str:
    if sentence.startswith("|"):
        cells = [c.strip() for c in sentence.strip("|").split("|")]
        if len(cells) == 3:
            return f"{cells[2]} (default {cells[1]})"
    return sentence


def environment(repo_root: Path) -> tuple[list[Setting], list[Setting]]:
    """``ONCEFLOW_*`` environment variables and the Airflow Variables the code reads."""
    env: dict[str, Setting] = {}
    variables: dict[str, Setting] = {}
    texts: dict[str, list[str]] = {}
    conn_ids = {c.conn_id for c in connections(repo_root)}
    for path in _scanned_files(repo_root):
        rel = path.relative_to(repo_root).as_posix()
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for m in AIRFLOW_VAR.finditer(source):
            name = (m.group(1) or m.group(2)).lower()
            variables.setdefault(name, Setting(name)).files.add(rel)
        cleaned = re.sub(r"AIRFLOW_(?:CONN|VAR)_ONCEFLOW_\w+|ONCEFLOW__\w+", "", source)
        lines = cleaned.splitlines()
        for m in ENV_VAR.finditer(cleaned):
            if m.group(0).lower() not in conn_ids:  # a connection id spelled for AIRFLOW_CONN_<ID>
                setting = env.setdefault(m.group(0), Setting(m.group(0)))
                setting.files.add(rel)
                comment = _attached_comment(lines, cleaned.count("\n", 0, m.start()))
                if comment and not setting.attached:
                    setting.attached, setting.attached_from = comment, rel
        texts[rel] = _texts(path, source)
    _describe(env, texts)
    _describe(variables, texts)
    return sorted(env.values(), key=lambda s: s.name), sorted(variables.values(), key=lambda s: s.name)


def _settings_table(settings: list[Setting]) -> str:
    out = ["| name | read in | what it does |\n|---|---|---|\n"]
    for s in settings:
        where = "<br>".join(f"`{f}`" for f in sorted(s.files))
        out.append(f"| `{s.name}` | {where} | {_cell(s.description) or '(no description in the code)'} |\n")
    return "".join(out)


def _settings_page(repo_root: Path) -> str:
    from onceflow.get_provider_info import get_provider_info

    out = [
        "# Settings and environment variables\n\n",
        "Scanned from `providers/`, `dags/`, `plugins/`, `.ci/` and the `Makefile` at every build; "
        "each description is the sentence of the code's docstrings or comments that names the "
        "setting. Connections are on [their own page](connections.md).\n\n",
        "## Airflow configuration\n\n",
        "Declared by the provider (`get_provider_info()['config']`), so `airflow config list` shows "
        "them; set as `AIRFLOW__<SECTION>__<KEY>` environment variables or in `airflow.cfg`.\n\n",
        "| section | key | default | environment variable | what it does |\n|---|---|---|---|---|\n",
    ]
    for section, spec in get_provider_info().get("config", {}).items():
        for key, option in spec["options"].items():
            env = f"AIRFLOW__{section.upper()}__{key.upper()}"
            out.append(
                f"| `[{section}]` | `{key}` | `{option.get('default')}` | `{env}` | {_cell(option['description'])} |\n"
            )
    env, variables = environment(repo_root)
    out.append("\n## Airflow Variables\n\n")
    out.append(_settings_table(variables))
    out.append("\n## Environment variables\n\nRead by the provider, the DAGs or the plugins:\n\n")
    out.append(_settings_table([s for s in env if not s.tests_only]))
    out.append(
        "\n### Tests, the local run and CI\n\nRead only by `onceflow.testing` (the pytest plugin, "
        "the local run's helpers) or by `.ci/`:\n\n"
    )
    out.append(_settings_table([s for s in env if s.tests_only]))
    return "".join(out)


# ---------------------------------------------------------------- command line


def _help(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same page on every machine
    try:
        return parser.format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _walk(
    parser: argparse.ArgumentParser, path: list[str]
) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, [*path, name])


def _captured_help(main: Callable[[list[str]], Any], argv: list[str]) -> str:
    buf = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(argv)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return buf.getvalue()


def commands() -> list[tuple[str, str]]:
    """(command line, its ``--help``) for every command and subcommand of both console scripts."""
    from onceflow.cli import build_parser
    from onceflow.testing.sheets_emulator.cli import build_parser as emulator_parser
    from onceflow.watchdog.__main__ import main as watchdog_main

    out = []
    for path, parser in _walk(build_parser(), ["onceflow"]):
        if path == ["onceflow", "sheets-emulator"]:
            out.append((" ".join(path), _help(emulator_parser())))
        else:
            out.append((" ".join(path), _help(parser)))
    out.append(("onceflow-watchdog", _captured_help(watchdog_main, ["--help"])))
    return out


def _cli_page() -> str:
    out = [
        "# Command line\n\n",
        "The `--help` of every command of the two console scripts, as the installed code prints "
        "it (`onceflow sheets-emulator` hands every option to the emulator, whose help this is).\n\n",
    ]
    for name, text in commands():
        out.append(f"## `{name}`\n\n```text\n{text.rstrip()}\n```\n\n")
    return "".join(out)


# ---------------------------------------------------------------- watchdog configuration


def watchdog_keys() -> list[tuple[str, str, str, str]]:
    """(key as a dotted TOML path, type, default, description) of every key the watchdog accepts.

    Read from the config's pydantic models where it has them, else from the key sets the
    validator checks unknown keys against and the dataclasses' defaults.
    """
    from onceflow.watchdog import config

    root = getattr(config, "WatchdogFile", None) or getattr(config, "WatchdogConfig", None)
    if hasattr(root, "model_fields"):
        return list(_model_rows("", root, ""))
    alert_defaults = {f: getattr(config.AlertConfig, f, "") for f in config.AlertConfig.__dataclass_fields__}
    rows = [(k, "", "", "") for k in sorted(config._TOP - {"alerts", "checks", "self_heartbeat"})]
    rows.append(("self_heartbeat.url", "", "", ""))
    for k in sorted(config._ALERT_KEYS):
        default = alert_defaults.get(k, alert_defaults.get(k.replace("_seconds", ""), ""))
        rows.append((f"alerts.{k}", "", repr(default) if default not in ("", None) else "", ""))
    rows += [(f"checks.<name>.{k}", "", "", "every check") for k in sorted(config._COMMON)]
    for kind, keys in config._KIND_KEYS.items():
        rows += [(f"checks.<name>.{k}", "", "", f"kind `{kind}`") for k in sorted(keys)]
    return rows


def _models_in(annotation: Any) -> tuple[str, list[Any]]:
    """The pydantic models an annotation holds, and the key infix they sit under."""
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if hasattr(annotation, "model_fields"):
        return ".", [annotation]
    if origin in (dict, typing.Mapping) or (
        origin is not None and getattr(origin, "__name__", "") == "Mapping"
    ):
        infix, models = _models_in(args[-1]) if args else ("", [])
        return (".<name>" + infix, models) if models else ("", [])
    if args:
        found = [_models_in(a) for a in args]
        models = [m for _, ms in found for m in ms]
        infix = next((i for i, ms in found if ms), "")
        if origin in (list, tuple):
            infix = "[]" + infix
        return infix, models
    return "", []


def _model_rows(prefix: str, model: Any, applies: str) -> Iterator[tuple[str, str, str, str]]:
    import typing

    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        infix, nested = _models_in(info.annotation)
        if nested:
            for sub in nested:
                label = sub.__name__ if len(nested) > 1 else applies
                yield from _model_rows(key + infix, sub, label)
            continue
        simple = getattr(info.annotation, "__name__", None) if not typing.get_args(info.annotation) else None
        annotation = simple or str(info.annotation).replace("typing.", "")
        default = "" if info.is_required() else repr(info.get_default(call_default_factory=True))
        desc = info.description or ""
        yield (key, annotation, default, f"{applies}: {desc}" if applies else desc)


def _watchdog_page() -> str:
    out = [
        "# Watchdog configuration\n\n",
        "Every key `onceflow-watchdog --config FILE` accepts, read from `onceflow.watchdog.config` "
        "at build time. An unknown key is refused with its dotted path; the checks, alerts and "
        "examples are explained in [the dead-man's switch](../watchdog.md#configuration-reference), "
        "what to do about each alert in the runbook.\n\n",
        "| key | type | default | applies to / meaning |\n|---|---|---|---|\n",
    ]
    for key, typ, default, desc in watchdog_keys():
        out.append(
            f"| `{key}` | {f'`{typ}`' if typ else ''} | {f'`{_cell(default)}`' if default else ''} | {_cell(desc)} |\n"
        )
    return "".join(out)


def pages(repo_root: Path) -> dict[str, str]:
    """The table pages (uri -> Markdown)."""
    return {
        "reference/connections.md": _connections_page(repo_root),
        "reference/settings.md": _settings_page(repo_root),
        "reference/cli.md": _cli_page(),
        "reference/watchdog-config.md": _watchdog_page(),
    }
