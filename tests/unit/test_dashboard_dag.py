"""sales_dashboard parses cheaply and listens to exactly the Asset that daily_sales produces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"

PARSE = """
import json, sys
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
    "deadline": [type(d.reference).__name__ for d in (sales.deadline or [])],
}))
"""


def parse_dags(tmp_path: Path) -> dict[str, object]:
    folder = tmp_path / "dags"
    folder.mkdir()
    for name in ("daily_sales.py", "sales_dashboard.py"):
        (folder / name).write_text((DAGS / name).read_text())
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, str(folder)], capture_output=True, text=True, timeout=300, check=True
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
    assert parsed["deadline"] == ["DagRunLogicalDateDeadline"]
