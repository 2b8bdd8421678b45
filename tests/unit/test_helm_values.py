"""deploy/helm: the values for the official Airflow chart and the watchdog's Deployment, checked
without a cluster.

* Not checked here: the values against the chart's own ``values.schema.json`` (a misspelt or
  mistyped key), nor the chart's templates rendered with them. The official chart is published
  only on airflow.apache.org and in apache/airflow, neither reachable from this project's
  machines, and no package registry ships it (docs/deploy.md says what would unblock it).
* It is onceflow's topology: CeleryExecutor, two schedulers, a dag-processor, a triggerer, our
  image, every secret from a Kubernetes Secret and none in the file, every onceflow connection,
  pools and the ledger's schema in the chart's migration job (each command parsed by Airflow's
  CLI parser and onceflow's), task logs in GCS, every ``config`` option one Airflow or onceflow has.
* The watchdog's Deployment validates against Kubernetes' own strict JSON schema (unknown fields
  refused) of the oldest and newest minor ``kubernetes-validate`` ships (fetched by ``make
  install``: ``published_schemas.py``); its command parses with the watchdog's own parser and
  reads the mounted file, its image is the chart's, its selector matches its pods.
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
import published_schemas
import pytest
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
VALUES: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())
WATCHDOG: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "helm" / "watchdog-deployment.yaml").read_text())


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
    for inline, by_name in [
        ("fernetKey", "fernetKeySecretName"),
        ("jwtSecret", "jwtSecretName"),
        ("apiSecretKey", "apiSecretKeySecretName"),
    ]:
        assert VALUES.get(inline) is None and VALUES[by_name], inline
    data = VALUES["data"]
    for connection in ("metadata", "resultBackend", "brokerUrl"):
        assert data[f"{connection}SecretName"] and f"{connection}Connection" not in data, connection
    assert VALUES["postgresql"]["enabled"] is False  # not the chart's in-cluster database


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


def _k8s_errors(manifest: dict[str, Any], version: str) -> list[str]:
    """Kubernetes' strict JSON schema of a ``Deployment`` at ``version``, with its definitions."""
    definitions = published_schemas.load(f"kubernetes/{version}/_definitions.json")
    schema = published_schemas.load(f"kubernetes/{version}/deployment-apps-v1.json")
    registry: Registry[Any] = Registry().with_resources(
        (r["$id"], Resource.from_contents(r)) for r in (definitions, schema)
    )
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(manifest)]


@pytest.mark.parametrize("version", published_schemas.KUBERNETES_VERSIONS)
def test_the_watchdog_deployment_validates_against_kubernetes_schema(version: str) -> None:
    assert _k8s_errors(WATCHDOG, version) == []
    assert "Apache License" in published_schemas.path("LICENSE.kubernetes-validate").read_text()


def test_the_kubernetes_check_refuses_misspelt_and_mistyped_fields() -> None:
    broken = copy.deepcopy(WATCHDOG)
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    broken["spec"]["replicas"] = "one"
    for version in published_schemas.KUBERNETES_VERSIONS:
        errors = _k8s_errors(broken, version)
        assert any("'volumeMount'" in e for e in errors), errors
        assert any("'one'" in e for e in errors), errors


def test_the_watchdog_deployment_is_valid_and_runs_the_watchdog() -> None:
    assert (WATCHDOG["apiVersion"], WATCHDOG["kind"]) == ("apps/v1", "Deployment")
    spec = WATCHDOG["spec"]
    assert spec["replicas"] == 1
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
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
