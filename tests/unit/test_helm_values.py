"""deploy/helm: the values for the official Airflow chart and the watchdog's Deployment, checked
without a cluster.

* ``values.yaml`` merged onto the chart's defaults the way Helm merges values (maps recursively,
  anything else replaced, ``null`` deletes) validates against the chart's own
  ``values.schema.json`` (vendored with its licence in ``tests/data/airflow-chart``), as
  ``helm install`` checks it, and the check does refuse a misspelt key.
* It is onceflow's topology: CeleryExecutor, two schedulers, a dag-processor, a triggerer, our
  image, every secret from a Kubernetes Secret and none in the file, every onceflow connection,
  pools and the ledger's schema in the chart's migration job (each command parsed by Airflow's
  CLI parser and onceflow's), task logs in GCS.
* The watchdog's Deployment: its container validates against the Kubernetes ``Container`` schema
  the chart vendors, its command parses with the watchdog's own parser and reads the mounted file,
  its image is the chart's, its selector matches its pods.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "tests" / "data" / "airflow-chart"
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
VALUES: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())
WATCHDOG: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "helm" / "watchdog-deployment.yaml").read_text())


def helm_merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of a values file onto the chart's defaults."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = helm_merge(base.get(key), value)
        return merged
    return copy.deepcopy(override)


def _errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(helm_merge(DEFAULTS, values))]


def test_the_chart_files_are_vendored_with_their_licence() -> None:
    assert "Apache License" in (CHART / "LICENSE").read_text()
    assert "The Apache Software Foundation" in (CHART / "NOTICE").read_text()
    assert "1.22.0" in (CHART / "README.md").read_text()
    assert _errors({}) == []  # the chart's own defaults pass its schema


def test_values_validate_against_the_charts_schema() -> None:
    assert _errors(VALUES) == []


def test_the_schema_check_refuses_misspelt_and_mistyped_values() -> None:
    broken = copy.deepcopy(VALUES)
    broken["scheduler"]["replica"] = broken["scheduler"].pop("replicas")
    broken["workers"]["celery"]["replicas"] = "two"
    errors = _errors(broken)
    assert any("'replica'" in e for e in errors), errors
    assert any("'two'" in e for e in errors), errors


def test_it_is_the_distributed_topology_with_our_image() -> None:
    assert VALUES["executor"] == "CeleryExecutor"
    assert VALUES["scheduler"]["replicas"] == 2
    assert VALUES["workers"]["celery"]["replicas"] >= 2
    assert VALUES["dagProcessor"]["enabled"] is True and VALUES["triggerer"]["enabled"] is True
    from importlib.metadata import version

    assert VALUES["airflowVersion"] == version("apache-airflow")
    image = VALUES["images"]["airflow"]
    assert VALUES["images"]["useDefaultImageForMigration"] is False  # the job runs `onceflow`
    container = WATCHDOG["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert VALUES["dags"]["gitSync"]["subPath"] == "dags"


def test_no_secret_is_in_the_values_and_every_key_comes_from_one_secret() -> None:
    merged = helm_merge(DEFAULTS, VALUES)
    for inline, by_name in [
        ("fernetKey", "fernetKeySecretName"),
        ("jwtSecret", "jwtSecretName"),
        ("apiSecretKey", "apiSecretKeySecretName"),
    ]:
        assert VALUES.get(inline) is None and VALUES[by_name], inline
    assert merged["data"]["metadataSecretName"] and "metadataConnection" not in VALUES.get("data", {})
    assert merged["postgresql"]["enabled"] is False


def test_every_onceflow_connection_comes_from_a_secret() -> None:
    from onceflow.local_run import LocalRunConfig, environment

    cfg = LocalRunConfig.from_args(
        home="/tmp/unused", dags_folder="dags", plugins_folder="plugins", port=8080, demo_days=1
    )
    harness = {k for k in environment(cfg, 8080, 8090) if k.startswith("AIRFLOW_CONN_ONCEFLOW_")}
    declared = {s["envName"]: s for s in VALUES["secret"]}
    assert harness <= set(declared)
    assert "AIRFLOW_CONN_ONCEFLOW_TRANSLATE" in declared  # Composer/GKE have no Apertium
    assert {s["secretName"] for s in declared.values()} == {"onceflow-connections"}


def _job_commands() -> list[list[str]]:
    args = VALUES["migrateDatabaseJob"]["args"]
    assert args[:2] == ["bash", "-c"]
    return [part.strip().split(">")[0].split() for part in args[2].split(";") if part.strip()][1:]


def test_the_migration_job_makes_the_pools_and_the_ledger_schema() -> None:
    commands = _job_commands()
    assert commands == [
        ["airflow", "db", "migrate"],
        ["onceflow", "pools"],
        ["airflow", "pools", "import", "/tmp/onceflow_pools.json"],
        ["onceflow", "ledger", "upgrade", "--conn-id", "onceflow_ledger"],
    ]
    assert "onceflow pools > /tmp/onceflow_pools.json" in VALUES["migrateDatabaseJob"]["args"][2]
    from onceflow.cli import build_parser

    for argv in commands:
        if argv[0] == "onceflow":
            build_parser().parse_args(argv[1:])
    airflow = [argv[1:] for argv in commands if argv[0] == "airflow"]
    probe = "import json, sys\nfrom airflow.cli.cli_parser import get_parser\n"
    probe += "for argv in json.loads(sys.argv[1]):\n    get_parser().parse_args(argv)\nprint('parsed')"
    done = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(airflow)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"},
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("parsed"), done.stderr[-3000:]


def test_task_logs_go_to_gcs() -> None:
    logging = VALUES["config"]["logging"]
    assert logging["remote_logging"] == "True"
    assert logging["remote_base_log_folder"].startswith("gs://")
    assert VALUES["workers"]["celery"]["persistence"]["enabled"] is False


def test_the_config_sections_are_airflows_or_onceflows() -> None:
    from airflow.configuration import conf

    from onceflow.get_provider_info import get_provider_info

    ours = get_provider_info()["config"]
    for section, options in VALUES["config"].items():
        for key in options:
            known = conf.has_option(section, key) or key in ours.get(section, {}).get("options", {})
            assert known, f"[{section}] {key} is not an Airflow or onceflow option"


# -- the watchdog's Deployment -----------------------------------------------------------------------


def _k8s(definition: str, instance: Any) -> list[str]:
    schema = {"$ref": f"#/definitions/{definition}", "definitions": SCHEMA["definitions"]}
    return [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(instance)]


def test_the_watchdog_deployment_is_valid_and_runs_the_watchdog() -> None:
    assert (WATCHDOG["apiVersion"], WATCHDOG["kind"]) == ("apps/v1", "Deployment")
    spec = WATCHDOG["spec"]
    assert spec["replicas"] == 1
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert _k8s("io.k8s.api.core.v1.Container", container) == []
    for volume in pod["volumes"]:
        assert _k8s("io.k8s.api.core.v1.Volume", volume) == []
    assert _k8s("io.k8s.api.core.v1.PodSecurityContext", pod["securityContext"]) == []
    # the command parses with the watchdog's own parser, and its config is the mounted Secret
    from onceflow.watchdog.__main__ import main

    assert container["command"][0] == "onceflow-watchdog"
    config = container["command"][container["command"].index("--config") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[str(Path(config).parent)]]["secret"]["secretName"] == "onceflow-watchdog"
    helped = subprocess.run(
        [sys.executable, "-m", "onceflow.watchdog", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and "--config" in helped.stdout
    assert callable(main)
    # its state_dir (deploy/watchdog.toml, the template) is a writable volume
    from onceflow.watchdog.config import load_config

    template = load_config(REPO / "deploy" / "watchdog.toml")
    assert str(template.state_dir) in mounts
    probe = container["livenessProbe"]["exec"]["command"]
    assert probe[:2] == ["python", "-c"] and config in probe[2]
    compile(probe[2], "liveness probe", "exec")
