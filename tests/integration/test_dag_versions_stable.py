"""Parsing unchanged DAG files again makes no new DAG version (issue 26, item 1).

Airflow 3 writes a new serialized DAG, and a new DAG version once a run used the old one,
whenever the serialized DAG's hash changes. Each DAG folder is parsed and written to the
metadata DB by ``airflow dags reserialize`` twice, in two separate processes (as two
dag-processor parses are), and each DAG's hash, version and deadline alert ids must be the
same after the second: an object repr with a memory address (``weight_rule`` in
``default_args``) or a fresh deadline UUID would differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _reserialize(airflow_db: Any) -> None:
    env = {
        **os.environ,
        **airflow_db.variables,
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        # the dag-processor's default (30 s) would skip the second write and hide any change
        "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "reserialize"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _versions(airflow_db: Any) -> dict[str, tuple[Any, ...]]:
    """dag_id -> (hash, newest version id, ids of its deadline alerts) as stored."""
    from airflow.models.deadline_alert import DeadlineAlert
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[str, tuple[Any, ...]] = {}
    with create_session() as session:
        for sdm in session.scalars(select(SerializedDagModel).order_by(SerializedDagModel.created_at)):
            alerts = session.scalars(
                select(DeadlineAlert.id).where(DeadlineAlert.serialized_dag_id == sdm.id)
            ).all()
            out[sdm.dag_id] = (sdm.dag_hash, sdm.dag_version_id, sorted(str(a) for a in alerts))
    return out


@pytest.mark.real_airflow
def test_parsing_every_dag_twice_in_separate_processes_changes_no_version(airflow_db: Any) -> None:
    _reserialize(airflow_db)
    first = _versions(airflow_db)
    assert {"daily_sales", "article_pipeline", "heartbeat"} <= set(first)
    assert first["daily_sales"][2], "daily_sales has a deadline alert"

    _reserialize(airflow_db)
    second = _versions(airflow_db)

    changed = {d: (first[d], second.get(d)) for d in first if second.get(d) != first[d]}
    assert changed == {}, f"a second parse changed these DAGs' serialization: {changed}"


def test_recent_first_weight_rule_serialises_without_a_memory_address() -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    from onceflow.priority import RecentFirstWeightStrategy

    rendered = DagSerialization.serialize({"weight_rule": RecentFirstWeightStrategy()})
    assert "0x" not in repr(rendered)
    assert repr(RecentFirstWeightStrategy()) == "onceflow.priority.RecentFirstWeightStrategy"
