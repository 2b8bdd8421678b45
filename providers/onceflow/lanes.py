"""Lanes: new work and rechecks run apart, so a large recheck never delays new work.

Airflow fixes a task's pool and priority weight when the DAG is parsed, and a DAG's
``max_active_runs`` is one number for all of its runs; nothing in a run's conf can change them.
So a lane is its own DAG, built by the same factory: ``article_pipeline`` takes new work, and
``article_pipeline_recheck`` takes rechecks, with every task in pool ``onceflow_recheck`` at a
priority weight below any new-work task's, and its own ``max_active_runs``. A user sees the two
lanes side by side in the UI and can pause the recheck lane alone.

The run conf key ``onceflow_lane`` (written by ``RecheckDispatchOperator``; absent means ``new``)
says which lane a run was made for; a chain's first task refuses a run sent to the other lane's
DAG (:func:`check_run_lane`), because running it there is exactly the crowding out lanes prevent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The ledger's lane names (``onceflow.ledger.recheck.RECHECK_LANE``), written out: DAG files import
# this module at parse time and need none of the ledger's machinery.
NEW_LANE = "new"
RECHECK_LANE = "recheck"
LANE_CONF_KEY = "onceflow_lane"
RECHECK_POOL = "onceflow_recheck"
#: Weight of every recheck-lane task (rule ``absolute``): below Airflow's default of 1, so when
#: both lanes wait for executor slots, new work goes first.
RECHECK_PRIORITY_WEIGHT = -100


class WrongLane(ValueError):
    """A run was sent to the DAG of another lane."""


@dataclass(frozen=True)
class Lane:
    """How one lane's chain DAG runs.

    :param name: ``new`` or ``recheck`` (the ledger's lanes).
    :param dag_suffix: added to the chain's DAG id (``article_pipeline`` + ``_recheck``).
    :param max_active_runs: the lane DAG's own run limit.
    :param pool: pool of every task in the lane; ``None`` keeps each task's own pool.
    :param priority_weight: weight of every task (rule ``absolute``); ``None`` keeps Airflow's.
    """

    name: str
    dag_suffix: str
    max_active_runs: int
    pool: str | None = None
    priority_weight: int | None = None

    def dag_id(self, chain_dag_id: str) -> str:
        """The id of this lane's copy of the chain DAG ``chain_dag_id``."""
        return f"{chain_dag_id}{self.dag_suffix}"

    def task_args(self) -> dict[str, Any]:
        """``default_args`` that put every task of a chain DAG into this lane."""
        args: dict[str, Any] = {}
        if self.pool is not None:
            args["pool"] = self.pool
        if self.priority_weight is not None:
            args.update(priority_weight=self.priority_weight, weight_rule="absolute")
        return args


LANES: dict[str, Lane] = {
    NEW_LANE: Lane(NEW_LANE, "", max_active_runs=16),
    # one recheck slot by default: more active runs would only wait for it
    RECHECK_LANE: Lane(
        RECHECK_LANE,
        "_recheck",
        max_active_runs=4,
        pool=RECHECK_POOL,
        priority_weight=RECHECK_PRIORITY_WEIGHT,
    ),
}


def run_lane(conf: Mapping[str, Any] | None) -> str:
    """The lane a run was created for (``new`` when its conf does not say)."""
    lane = str((conf or {}).get(LANE_CONF_KEY) or NEW_LANE)
    if lane not in LANES:
        raise WrongLane(f"run conf {LANE_CONF_KEY}={lane!r} is not a lane; expected one of {sorted(LANES)}")
    return lane


def check_run_lane(conf: Mapping[str, Any] | None, lane: str, dag_id: str) -> None:
    """Refuse a run whose conf names another lane than the DAG ``dag_id`` serves.

    :raises WrongLane: with the DAG the run belongs in.
    """
    wanted = run_lane(conf)
    if wanted == lane:
        return
    chain = dag_id.removesuffix(LANES[lane].dag_suffix) if LANES[lane].dag_suffix else dag_id
    raise WrongLane(
        f"this run is for the {wanted!r} lane ({LANE_CONF_KEY}={wanted!r} in its conf) but {dag_id} "
        f"is the {lane!r} lane; send it to {LANES[wanted].dag_id(chain)} (for a recheck: the recheck "
        "DAG's chain_dag_id), so it does not take the other lane's pool and run slots"
    )
