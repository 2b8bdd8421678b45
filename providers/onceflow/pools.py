"""The pools onceflow's DAGs use, with the slot counts we recommend for one small deployment.

Pools cap concurrency against resources Airflow cannot see (the Sheets quota, the translator,
the warehouse). ``onceflow pools`` prints them as ``airflow pools import`` JSON.
"""

from __future__ import annotations

import json
from typing import NamedTuple


class PoolSpec(NamedTuple):
    """One pool: its name, recommended slots and description."""

    name: str
    slots: int
    description: str


POOLS: tuple[PoolSpec, ...] = (
    # not 1: every claimed row's first article_pipeline task is in this pool too, and 50 claimed
    # runs behind one slot would take minutes; the 60 reads + 60 writes/min quota is kept by the
    # queue's backoff on 429 (sheet_claim itself runs one claimer at a time: max_active_runs=1)
    PoolSpec(
        "onceflow_sheets",
        10,
        "Google Sheets tasks (claims, each claimed run's first step); the API quota is kept by backing off on 429",
    ),
    PoolSpec("onceflow_fetch", 4, "article fetches (outbound HTTP)"),
    PoolSpec(
        "onceflow_translate", 2, "translation calls (Apertium locally, Cloud Translation in production)"
    ),
    # max_active_runs of daily_sales is 4, one task of a run at a time: four slots let them all move.
    PoolSpec("onceflow_warehouse", 4, "partition loads into the warehouse"),
    PoolSpec("onceflow_recheck", 1, "rechecks, kept apart so they cannot crowd out new work"),
    PoolSpec("onceflow_heartbeat", 1, "the dead-man's-switch heartbeat, never starved by other work"),
)


def pools_import_json() -> str:
    """The pools in the format of ``airflow pools import FILE``."""
    return json.dumps(
        {p.name: {"slots": p.slots, "description": p.description, "include_deferred": False} for p in POOLS},
        indent=2,
    )
