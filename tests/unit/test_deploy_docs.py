"""docs/deploy.md's Cloud Composer section, checked against the code it describes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "deploy.md").read_text()
COMPOSER = DOC.split("## Cloud Composer 3", 1)[1].split("\n## ", 1)[0]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _secrets() -> dict[str, str]:
    rows = re.findall(r"^\s*\| `airflow-connections-(\w+)` \| (.+?) \|$", COMPOSER, re.M)
    return dict(rows)


def test_the_requirement_names_extras_that_exist_and_not_airflow() -> None:
    block = COMPOSER.split("```text", 1)[1].split("```", 1)[0]
    (line,) = [line.strip() for line in block.splitlines() if line.strip()]
    match = re.fullmatch(r"airflow-provider-onceflow\[([\w,]+)\]==([\d.]+)", line)
    assert match, line
    assert set(match.group(1).split(",")) <= set(PYPROJECT["project"]["optional-dependencies"])
    assert match.group(2) == PYPROJECT["project"]["version"]
    assert "apache-airflow" not in block


def test_every_connection_the_dags_use_has_its_secret() -> None:
    from onceflow.local_run import LocalRunConfig, environment

    cfg = LocalRunConfig.from_args(
        home="/tmp/unused", dags_folder="dags", plugins_folder="plugins", port=8080, demo_days=1
    )
    used = {
        k[len("AIRFLOW_CONN_") :].lower()
        for k in environment(cfg, 8080, 8090)
        if k.startswith("AIRFLOW_CONN_")
    }
    assert used | {"onceflow_translate"} <= set(_secrets())


def _json(cell: str) -> dict:
    return dict(json.loads(re.search(r"`(\{.*\})`", cell).group(1)))  # type: ignore[union-attr]


def test_the_example_connections_pass_their_hooks_validation() -> None:
    from onceflow.articles.fetch import FetchPolicy
    from onceflow.hooks.storage import parse_config
    from onceflow.hooks.translate import validate_extras

    secrets = _secrets()
    storage = _json(secrets["onceflow_storage"])
    assert storage["conn_type"] == "onceflow_storage"
    assert parse_config(storage["extra"], default_base="file:///unused").base.startswith("gs://")
    FetchPolicy.from_extras(_json(secrets["onceflow_fetch"])["extra"])
    translate = _json(secrets["onceflow_translate"])
    # Composer cannot install Debian packages: the backend must not be Apertium
    assert validate_extras(translate["extra"])["backend"] == "google"
