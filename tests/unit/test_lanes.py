"""Lanes: the recheck lane's chain DAG is apart from new work, and a run in the wrong lane is refused.

The scheduling effect is measured under the real scheduler in
``tests/acceptance/test_recheck_lane_cluster.py``; here, what the DAG files declare.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.lanes import LANE_CONF_KEY, LANES, NEW_LANE, RECHECK_LANE, WrongLane, check_run_lane, run_lane

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_the_lane_names_are_the_ledgers() -> None:
    from onceflow.ledger.recheck import RECHECK_LANE as LEDGER_RECHECK_LANE

    assert RECHECK_LANE == LEDGER_RECHECK_LANE
    assert run_lane({}) == NEW_LANE and run_lane(None) == NEW_LANE


def test_a_recheck_run_sent_to_the_new_work_dag_is_refused_naming_the_right_dag() -> None:
    with pytest.raises(WrongLane, match="send it to article_pipeline_recheck"):
        check_run_lane({LANE_CONF_KEY: RECHECK_LANE}, NEW_LANE, "article_pipeline")
    with pytest.raises(WrongLane, match="send it to article_pipeline "):
        check_run_lane({}, RECHECK_LANE, "article_pipeline_recheck")
    with pytest.raises(WrongLane, match="is not a lane"):
        check_run_lane({LANE_CONF_KEY: "urgent"}, NEW_LANE, "article_pipeline")
    check_run_lane({LANE_CONF_KEY: RECHECK_LANE}, RECHECK_LANE, "article_pipeline_recheck")


def test_article_pipeline_has_a_recheck_lane_dag_apart_from_new_work() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS / "article_pipeline.py"))
    assert not bag.import_errors
    new, recheck = bag.dags["article_pipeline"], bag.dags["article_pipeline_recheck"]
    assert new.max_active_runs == LANES[NEW_LANE].max_active_runs
    assert recheck.max_active_runs == LANES[RECHECK_LANE].max_active_runs
    pools = {t.task_id: t.pool for t in new.tasks}
    assert (pools["fetch"], pools["translate"]) == ("onceflow_fetch", "onceflow_translate")
    sheet_tasks = {"read_claimed_row", "polish", "mark_needs_review", "write_back"}
    assert {pools[t] for t in sheet_tasks} == {"onceflow_sheets"}
    assert {t.pool for t in recheck.tasks} == {"onceflow_recheck"}
    assert max(t.priority_weight for t in recheck.tasks) < min(t.priority_weight for t in new.tasks)
    assert [t.task_id for t in recheck.tasks] == [t.task_id for t in new.tasks]
    assert {t.lane for t in recheck.tasks} == {RECHECK_LANE}  # type: ignore[attr-defined]

    rechecks = DagBag(str(DAGS / "recheck.py")).dags["recheck"]
    assert rechecks.params["chain_dag_id"] == "article_pipeline_recheck"
