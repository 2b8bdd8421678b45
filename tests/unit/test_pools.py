"""The pools the docs tell users to create are the pools ``onceflow pools`` prints."""

from __future__ import annotations

import re
from pathlib import Path

from onceflow.pools import POOLS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_pool_size_in_the_docs_is_the_one_pools_py_recommends() -> None:
    recommended = {p.name: p.slots for p in POOLS}
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for name, slots in re.findall(r"airflow pools set (onceflow_\w+) (\d+)", page.read_text()):
            found.append((page.name, name, int(slots)))
    assert found, "the docs no longer show how to create a pool"
    assert [f for f in found if recommended.get(f[1]) != f[2]] == []
