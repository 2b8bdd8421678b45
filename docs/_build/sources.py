"""Pages for the repository files that the docs link to (tests, benchmarks, DAGs, source).

A concept page says "this test shows it" with a relative link such as
``[test_outbox_crash.py](../../tests/integration/test_outbox_crash.py#test_name)``: that link works
in the repository's Markdown view, and on the site it is rewritten to a generated page that shows
the file, one section per top-level ``def``/``class`` (so ``#test_name`` is a checked anchor). A link
to a file that does not exist is left alone, so the strict build fails on it.
"""

from __future__ import annotations

import ast
import posixpath
import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

# [text](target) with a relative target; the target has no spaces or parentheses.
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
SOURCE_DIR = "source"
LANGUAGES = {
    ".py": "python",
    ".sql": "sql",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
}


@dataclass(frozen=True)
class RepoLink:
    """A link from a page (``page_uri``, relative to docs/) to a repository file (``repo_path``)."""

    page_uri: str
    repo_path: str


def repo_target(page_uri: str, target: str, docs_dir: Path, repo_root: Path) -> str | None:
    """The repository path a relative link from ``page_uri`` points to, when it leaves docs/."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), target))
    if not joined.startswith("../"):
        return None  # inside docs/: mkdocs checks it
    path = (docs_dir / joined).resolve()
    try:
        rel = path.relative_to(repo_root.resolve())
    except ValueError:
        return None
    return rel.as_posix() if path.is_file() else None


def source_page_uri(repo_path: str) -> str:
    """Where the generated page for ``repo_path`` lives in the site (relative to docs/)."""
    return f"{SOURCE_DIR}/{repo_path}.md"


def rewrite_links(markdown: str, page_uri: str, docs_dir: Path, repo_root: Path) -> str:
    """Point every link to a repository file outside docs/ at its generated source page."""

    def sub(m: re.Match[str]) -> str:
        repo_path = repo_target(page_uri, m.group(2), docs_dir, repo_root)
        if repo_path is None:
            return m.group(0)
        new = posixpath.relpath(source_page_uri(repo_path), posixpath.dirname(page_uri) or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return LINK.sub(sub, markdown)


def linked_files(pages: dict[str, str], docs_dir: Path, repo_root: Path) -> set[str]:
    """Repository paths linked from ``pages`` (page uri -> markdown)."""
    found = set()
    for uri, text in pages.items():
        for m in LINK.finditer(text):
            repo_path = repo_target(uri, m.group(2), docs_dir, repo_root)
            if repo_path is not None:
                found.add(repo_path)
    return found


def _fence(code: str, language: str, first_line: int) -> str:
    ticks = "````" if "```" in code else "```"
    return f'{ticks} {language} linenums="{first_line}"\n{code.rstrip()}\n{ticks}\n'


def source_page(repo_path: str, repo_root: Path) -> str:
    """Markdown showing one repository file; a Python file gets one section per top-level definition."""
    text = (repo_root / repo_path).read_text(encoding="utf-8")
    suffix = Path(repo_path).suffix
    head = f"# `{repo_path}`\n\n"
    if suffix != ".py":
        if suffix == ".md":
            return head + text.split("\n", 1)[1] if text.startswith("# ") else head + text
        return head + _fence(text, LANGUAGES.get(suffix, "text"), 1)
    tree = ast.parse(text)
    lines = text.splitlines()
    doc = ast.get_docstring(tree)
    out = [head]
    if doc:
        out.append(doc.replace("``", "`") + "\n\n")
    starts = [
        (n.decorator_list[0].lineno if n.decorator_list else n.lineno, n.name)
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    if not starts:
        return "".join([*out, _fence(text, "python", 1)])
    bounds = [1, *(s for s, _ in starts), len(lines) + 1]
    names = ["(module)", *(n for _, n in starts)]
    for (begin, end), name in zip(pairwise(bounds), names, strict=True):
        chunk = "\n".join(lines[begin - 1 : end - 1])
        if not chunk.strip():
            continue
        if name != "(module)":
            out.append(f"## `{name}` {{#{name}}}\n\n")
        out.append(_fence(chunk, "python", begin) + "\n")
    return "".join(out)
