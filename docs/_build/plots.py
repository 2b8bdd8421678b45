"""The Benchmarks page: ``benchmarks/README.md`` with a plot (matplotlib, SVG) under each table of figures.

Plots are drawn at build time from the tables themselves, so the page shows whatever the README
says now and no image is committed. A table gets a plot when it has at least two rows and a column
whose every cell is a number (``1,234``, ``0.5x``, ``**3.2**``, ``12 s``, ``45%``); each such column
(at most four) is one panel of horizontal bars, labelled by the row's text cells.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

README = Path("benchmarks") / "README.md"
PAGE = "benchmarks.md"
IMAGE_DIR = "benchmarks"
MAX_PANELS = 3
NUMBER = re.compile(r"^[~≈]?(-?[\d,]*\.?\d+)\s*(x|%|s|ms|min|MB|MiB)?$")


@dataclass(frozen=True)
class Table:
    """One Markdown table of the README: where it ends, its caption, header and rows."""

    end_line: int
    caption: str
    header: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell: str) -> float | None:
    """The cell's value when it is one number (units and bold allowed), else ``None``."""
    m = NUMBER.match(cell.replace("*", "").replace("`", "").strip())
    return float(m.group(1).replace(",", "")) if m else None


def tables(text: str) -> list[Table]:
    """Every table of ``text``, with the nearest heading or bold lead-in above it as its caption."""
    lines = text.splitlines()
    found, caption, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            caption = line.lstrip("#").strip()
        elif line.startswith("**"):
            caption = line.split("**")[1]
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
            header = _cells(line)
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(_cells(lines[j]))
                j += 1
            found.append(Table(j, caption, header, [r for r in rows if len(r) == len(header)]))
            i = j
            continue
        i += 1
    return found


def label_columns(table: Table) -> list[int]:
    """The leading columns that name a row: the first, and the next ones until the names are unique."""
    cols = [0]
    while len(cols) < len(table.header) - 1:
        names = [tuple(r[c] for c in cols) for r in table.rows]
        if len(set(names)) == len(names):
            break
        cols.append(len(cols))
    return cols


def numeric_columns(table: Table) -> list[int]:
    """The value columns whose every cell is a number (at most ``MAX_PANELS``)."""
    labels = label_columns(table)
    return [
        c
        for c in range(len(labels), len(table.header))
        if table.rows and all(number(r[c]) is not None for r in table.rows)
    ][:MAX_PANELS]


def plot(table: Table) -> str | None:
    """The table as an SVG of horizontal bars, one panel per numeric column; ``None`` if nothing to plot."""
    columns = numeric_columns(table)
    if len(table.rows) < 2 or not columns:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable files
    plt.rcParams["svg.hashsalt"] = "onceflow"  # the same figures give the same file
    labels = [
        " / ".join(r[c].replace("`", "").replace("*", "") for c in label_columns(table)) for r in table.rows
    ]
    height = 0.6 + 0.28 * len(labels)
    fig, axes = plt.subplots(
        1, len(columns), figsize=(3.2 * len(columns) + 2.5, height), sharey=True, squeeze=False
    )
    for ax, c in zip(axes[0], columns, strict=True):
        values = [number(r[c]) or 0.0 for r in table.rows]
        ax.barh(range(len(values)), values, color="#3f51b5")
        ax.set_title(table.header[c].replace("`", "").replace("*", ""), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.invert_yaxis() if ax is axes[0][0] else None
    axes[0][0].set_yticks(range(len(labels)), labels)
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    return out.getvalue()


def files(repo_root: Path) -> dict[str, bytes | str]:
    """The Benchmarks page and its plots (uri relative to docs/ -> content)."""
    text = (repo_root / README).read_text(encoding="utf-8")
    lines = text.splitlines()
    out: dict[str, bytes | str] = {}
    inserts: dict[int, str] = {}
    for n, table in enumerate(tables(text), start=1):
        svg = plot(table)
        if svg is None:
            continue
        name = f"{IMAGE_DIR}/plot-{n}.svg"
        out[name] = svg
        inserts[table.end_line] = f"\n![{table.caption or 'figures above'}]({name})\n"
    page = []
    for i, line in enumerate([*lines, ""]):
        if i in inserts:
            page.append(inserts[i])
        page.append(line)
    intro = (
        "\n\nThe plots are drawn at build time from the tables of `benchmarks/README.md` "
        "(`docs/_build/plots.py`): each numeric column of a table is one panel.\n"
    )
    body = "\n".join(page)
    first_break = body.find("\n", body.find("# "))
    out[PAGE] = body[:first_break] + intro + body[first_break:]
    return out
