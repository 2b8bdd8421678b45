"""sales_dashboard parses cheaply and listens to exactly the Asset that daily_sales produces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"

PARSE = """
import json, sys
from types import SimpleNamespace
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(sys.argv[1])
dashboard, sales = bag.dags["sales_dashboard"], bag.dags["daily_sales"]
[render] = dashboard.tasks
load = sales.get_task("load")
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "matplotlib_loaded": "matplotlib" in sys.modules,
    "pandas_loaded": "pandas" in sys.modules,
    "schedule": [[a.name, a.uri] for a in dashboard.timetable.asset_condition.objects],
    "outlets": [[a.name, a.uri] for a in load.outlets],
    "owner": render.owner, "retries": render.retries, "tags": sorted(dashboard.tags),
    "has_doc": bool(dashboard.doc_md), "pool": render.pool,
    "deadline": [
        [type(d.reference).__name__, d.reference.timezone, d.reference.due]
        for d in (sales.deadline or [])
    ],
    # What the scheduler stores when both wait for a warehouse slot: the render's weight rule and
    # the load's weight for a run whose interval ends now (no run to read: the strategy uses now).
    "render_weight": [str(render.weight_rule), render.priority_weight],
    "load_weight_now": load.weight_rule.get_weight(SimpleNamespace(task=load, dag_id="daily_sales", run_id="r")),
}))
"""


def parse_dags(tmp_path: Path) -> dict[str, object]:
    folder = tmp_path / "dags"
    folder.mkdir()
    for name in ("daily_sales.py", "sales_dashboard.py"):
        (folder / name).write_text((DAGS / name).read_text())
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "ONCEFLOW_BUSINESS_TZ": "Europe/Amsterdam"},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_dashboard_is_scheduled_on_the_asset_the_load_updates_and_parses_cheaply(tmp_path: Path) -> None:
    parsed = parse_dags(tmp_path)

    assert parsed["errors"] == {}
    assert (
        parsed["schedule"]
        == parsed["outlets"]
        == [["onceflow.warehouse.daily_sales", "x-onceflow://warehouse/daily_sales"]]
    )
    assert parsed["matplotlib_loaded"] is False
    assert parsed["pandas_loaded"] is False
    assert parsed["owner"] == "data-eng" and parsed["retries"] == 2
    assert parsed["tags"] == ["dashboard", "onceflow", "sales"] and parsed["has_doc"] is True
    assert parsed["pool"] == "onceflow_warehouse"
    assert parsed["deadline"] == [["BusinessTimeDeadline", "Europe/Amsterdam", "07:00"]]


def test_the_render_waits_behind_no_load_in_the_shared_warehouse_pool(tmp_path: Path) -> None:
    """A short read ahead of the loads: their recency weights are in the tens of millions."""
    parsed = parse_dags(tmp_path)

    rule, weight = parsed["render_weight"]
    assert rule == "absolute"
    assert weight > parsed["load_weight_now"] > 20_000_000
