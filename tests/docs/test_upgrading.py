"""docs/upgrading.md says what pyproject.toml and ``onceflow.compat`` say: versions and extras."""

from __future__ import annotations

import re

import pytest
from docs_site import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PAGE = REPO_ROOT / "docs" / "upgrading.md"


def _pyproject() -> dict[str, object]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _table_rows(text: str, header: str) -> dict[str, list[str]]:
    """The rows of the Markdown table under ``header`` (its first line), by their first cell."""
    lines = text[text.index(header) :].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]


def test_the_supported_airflow_versions_are_the_declared_ones() -> None:
    from onceflow.compat import OLDEST_SUPPORTED_AIRFLOW

    text = PAGE.read_text(encoding="utf-8")
    (airflow,) = [r for r in _pyproject()["dependencies"] if _name(r) == "apache-airflow"]  # type: ignore[attr-defined]
    assert f"`{airflow}`" in text, f"the page does not declare {airflow}"
    rows = _table_rows(text, "| Airflow | status |")
    oldest = int(OLDEST_SUPPORTED_AIRFLOW.split(".")[1])
    for minor in range(oldest, 4):
        assert rows.get(f"3.{minor}", ["not supported"])[0].startswith("supported"), f"3.{minor}: {rows}"
    assert all(
        "not supported" in cells[0]
        for v, cells in rows.items()
        if v not in {f"3.{m}" for m in range(oldest, 4)}
    )


def test_the_extras_table_is_pyprojects() -> None:
    extras: dict[str, list[str]] = _pyproject()["optional-dependencies"]  # type: ignore[assignment]
    rows = _table_rows(PAGE.read_text(encoding="utf-8"), "| extra | for | brings |")
    assert sorted(rows) == sorted(extras)
    for extra, requirements in extras.items():
        if extra == "all":
            continue
        brings = set(re.findall(r"`([^`]+)`", rows[extra][1]))
        assert brings == {_name(r) for r in requirements}, extra
