"""The pools onceflow's DAGs use, with the slot counts we recommend for one small deployment.

Pools cap concurrency against resources Airflow cannot see (the Sheets quota, the translator,
the warehouse). ``onceflow pools`` prints them as ``airflow pools import`` JSON.
"""

from __future__ import annotations

import json
from typing import NamedTuple


class PoolSpec(NamedTuple):
    name: str
    slots: int
    description: str


POOLS: tuple[PoolSpec, ...] = (
    PoolSpec("onceflow_sheets", 1, "Google Sheets writes: one claimer at a time keeps within 60 writes/min"),
    PoolSpec("onceflow_fetch", 4, "article fetches (outbound HTTP)"),
    PoolSpec(
        "onceflow_translate", 2, "translation calls (Apertium locally, Cloud Translation in production)"
    ),
    PoolSpec("onceflow_warehouse", 2, "partition loads into the warehouse"),
    PoolSpec("onceflow_recheck", 1, "rechecks, kept apart so they cannot crowd out new work"),
    PoolSpec("onceflow_heartbeat", 1, "the dead-man's-switch heartbeat, never starved by other work"),
)


def pools_import_json() -> str:
    """The pools in the format of ``airflow pools import FILE``."""
    return json.dumps(
        {p.name: {"slots": p.slots, "description": p.description, "include_deferred": False} for p in POOLS},
        indent=2,
    )
