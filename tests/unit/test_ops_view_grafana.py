"""deploy/grafana/onceflow-operations.json is built on the metrics the view exports, all of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from onceflow.opsview import metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
NAME = re.compile(r"\bonceflow_ops_[a-z0-9_]+")


def _panels() -> list[dict]:
    return json.loads((DEPLOY / "onceflow-operations.json").read_text())["panels"]


def test_every_query_names_an_exported_metric_and_every_metric_has_a_panel() -> None:
    exported = {metrics.PREFIX + name for name in metrics.HELP}
    used = {m for p in _panels() for t in p.get("targets", []) for m in NAME.findall(t["expr"])}
    assert used - exported == set(), "the dashboard queries metrics the view does not export"
    assert exported - used == set(), "exported metrics without a panel"


def test_panels_do_not_overlap_and_have_unique_ids() -> None:
    panels = _panels()
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        assert g["x"] + g["w"] <= 24
        cells |= mine


def test_the_scrape_job_reads_the_metrics_path_with_a_bearer_token() -> None:
    job = yaml.safe_load((DEPLOY / "prometheus-scrape.yaml").read_text())["scrape_configs"][0]
    assert job["metrics_path"] == "/onceflow-ops/metrics"
    assert job["authorization"]["type"] == "Bearer"
