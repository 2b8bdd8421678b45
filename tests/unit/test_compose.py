"""docker-compose.yaml and the Dockerfile, checked without a Docker engine.

* The compose file validates against the Compose Specification's JSON schema (as published in
  the ``check-jsonschema`` wheel, fetched by ``make install``: ``published_schemas.py``), and the
  validator does refuse a broken file.
* Every command a service of our image runs exists and parses: ``airflow`` subcommands by
  Airflow 3.3's own CLI parser (with the CeleryExecutor, whose ``celery`` commands come from the
  provider), console scripts by the parsers behind pyproject's ``[project.scripts]``,
  ``python -m`` modules by their ``build_parser()``.
* It runs what the harness runs (``onceflow up``, ``onceflow.local_run``): the same DAG and
  plugins folders, the same onceflow connections (each parsed by the code that reads it, each
  host a service of the file on the port that service listens on), the pools of
  ``onceflow pools``, the ledger schema, the demo sheet, the watchdog's config.

Third-party images (postgres, redis, fake-gcs-server) are only schema-checked.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from importlib import import_module
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import published_schemas
import pytest
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
OURS = {name: s for name, s in SERVICES.items() if "build" in s}  # services running our image
COMMON_ENV: dict[str, str] = COMPOSE["x-airflow-common"]["environment"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _argv(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def _commands(service: dict[str, Any]) -> list[list[str]]:
    """What the container runs. The image's entrypoint hands a bare command to ``airflow``;
    a ``bash -c`` script is read line by line for the airflow and onceflow commands in it."""
    entrypoint, command = _argv(service.get("entrypoint")), _argv(service.get("command"))
    if not entrypoint:
        return [["airflow", *command]]
    if entrypoint == ["/bin/bash"] and command[:1] == ["-c"]:
        lines = (line.strip() for line in command[1].splitlines())
        return [shlex.split(line.split(">")[0]) for line in lines if re.match(r"(airflow|onceflow) ", line)]
    return [[*entrypoint, *command]]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> repository path of the service's bind mounts."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            found[target] = source[2:]
    return found


def _conn(name: str) -> Any:
    from airflow.models.connection import Connection

    value = COMMON_ENV[f"AIRFLOW_CONN_{name.upper()}"]
    if value.lstrip().startswith("{"):
        return Connection.from_json(value, conn_id=name)
    return Connection(conn_id=name, uri=value)


def _init_script() -> str:
    return str(_argv(SERVICES["airflow-init"]["command"])[1])


# -- the file is valid -----------------------------------------------------------------------------


def _schema_errors(document: dict[str, Any]) -> list[str]:
    schema = published_schemas.load("compose-spec.json")
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]


def test_the_schema_is_the_published_compose_specification_with_its_licence() -> None:
    schema = published_schemas.path("compose-spec.json")
    assert json.loads(schema.read_text())["title"] == "Compose Specification"
    # unmodified: the hash check-jsonschema recorded when it took the file from the specification
    recorded = published_schemas.path("compose-spec.sha256").read_text().split()[0]
    assert hashlib.sha256(schema.read_bytes()).hexdigest() == recorded
    assert "Apache License" in published_schemas.path("LICENSE.compose-spec").read_text()


def test_compose_file_validates_against_the_compose_spec() -> None:
    assert _schema_errors(COMPOSE) == []


def test_the_schema_check_refuses_a_broken_file() -> None:
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["redis"]["helthcheck"] = broken["services"]["redis"].pop("healthcheck")
    broken["services"]["postgres"]["ports"] = "5432:5432"  # a list is required
    errors = _schema_errors(broken)
    assert any("helthcheck" in e for e in errors)
    assert any("'ports'" in e for e in errors)


def test_topology_is_the_distributed_one() -> None:
    assert COMMON_ENV["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert urlsplit(COMMON_ENV["AIRFLOW__CELERY__BROKER_URL"]).hostname == "redis"
    assert urlsplit(COMMON_ENV["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).hostname == "postgres"
    runs = {name: _commands(s)[0][1:] for name, s in OURS.items() if "entrypoint" not in s}
    assert sorted(runs.values()) == sorted(
        [
            ["api-server"],
            ["scheduler"],
            ["scheduler"],
            ["dag-processor"],
            ["triggerer"],
            *[["celery", "worker"]] * 2,
        ]
    )
    assert _commands(SERVICES["onceflow-watchdog"]) == [
        ["onceflow-watchdog", "--config", "/opt/onceflow/watchdog.toml"]
    ]
    offline = {name for name, s in SERVICES.items() if "offline" in s.get("profiles", [])}
    assert offline == {"sheets-emulator", "fake-gcs", "fake-gcs-init", "article-site"}
    # the always-on part needs nothing from the offline profile (it waits for the bucket only
    # when the profile runs: required false)
    for name, service in SERVICES.items():
        if name not in offline:
            for dependency in set(service.get("depends_on", {})) & offline:
                assert service["depends_on"][dependency]["required"] is False, (name, dependency)


# -- every command exists ----------------------------------------------------------------------------


def test_every_airflow_command_parses_in_airflow_3_3() -> None:
    commands = [c[1:] for s in OURS.values() for c in _commands(s) if c[0] == "airflow"]
    assert ["db", "migrate"] in commands and ["celery", "worker"] in commands
    # A subprocess: the CLI offers `celery` only when the executor is Celery.
    probe = "import json, sys\nfrom airflow.cli.cli_parser import get_parser\n"
    probe += "for argv in json.loads(sys.argv[1]):\n    get_parser().parse_args(argv)\nprint('parsed')"
    done = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("parsed")
    assert installed_version("apache-airflow").startswith("3.3.")


def _parse(module_name: str, args: list[str]) -> Any:
    module = import_module(module_name)
    build = getattr(module, "build_parser", None) or import_module(f"{module_name}.cli").build_parser
    return build().parse_args(args)


def test_every_onceflow_command_exists_and_parses() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    checked = []
    for service in OURS.values():
        for argv in _commands(service):
            program, args = argv[0], argv[1:]
            if program == "airflow":
                continue
            if program == "python":
                assert args[0] == "-m"
                _parse(args[1], args[2:])
            elif program == "onceflow":
                assert scripts["onceflow"] == "onceflow.cli:main"
                if args[0] == "sheets-emulator":  # onceflow.cli.main hands the rest to the emulator
                    _parse("onceflow.testing.sheets_emulator", args[1:])
                else:
                    from onceflow.cli import build_parser

                    build_parser().parse_args(args)
            elif program == "onceflow-watchdog":
                assert scripts["onceflow-watchdog"] == "onceflow.watchdog.__main__:main"
                helped = subprocess.run(
                    [sys.executable, "-m", "onceflow.watchdog", "--help"], capture_output=True, text=True
                )
                assert helped.returncode == 0 and "--config" in helped.stdout
            else:
                pytest.fail(f"unknown program {program!r} in {argv}")
            checked.append(program)
    assert set(checked) == {"python", "onceflow", "onceflow-watchdog"}


def test_the_watchdog_config_it_mounts_is_valid_and_watches_the_ledger_airflow_uses() -> None:
    from onceflow.watchdog.config import load_config

    service = SERVICES["onceflow-watchdog"]
    config_path = _argv(service["command"])[1]
    config = load_config(REPO / _mounts(service)[config_path])
    ledger, conn = urlsplit(config.ledger_url), _conn("onceflow_ledger")
    assert (ledger.hostname, ledger.port, ledger.path.lstrip("/")) == (conn.host, conn.port, conn.schema)
    assert {c.kind for c in config.checks} >= {"heartbeat", "business_freshness", "api_health"}
    api = next(c for c in config.checks if c.kind == "api_health")
    assert urlsplit(api.options["url"]).hostname == "airflow-apiserver"


# -- it runs what the harness runs -----------------------------------------------------------------


def test_dags_and_plugins_folders_are_the_harness_ones() -> None:
    from onceflow.cli import build_parser

    up = build_parser().parse_args(["up"])
    ini = PYPROJECT["tool"]["pytest"]["ini_options"]
    for service in OURS.values():
        mounts = _mounts(service)
        if COMMON_ENV["AIRFLOW__CORE__DAGS_FOLDER"] not in mounts:
            continue  # the watchdog and the emulators mount their own files, not DAGs
        assert (
            mounts[COMMON_ENV["AIRFLOW__CORE__DAGS_FOLDER"]] == up.dags_folder == ini["onceflow_dags_folder"]
        )
        assert mounts[COMMON_ENV["AIRFLOW__CORE__PLUGINS_FOLDER"]] == up.plugins_folder
        assert ini["onceflow_plugins_folder"] == up.plugins_folder


def test_connections_are_the_harness_ones_and_reach_services_of_this_file(tmp_path: Path) -> None:
    from onceflow.articles.fetch import FetchPolicy
    from onceflow.hooks.storage import parse_config
    from onceflow.local_run import LocalRunConfig, environment

    cfg = LocalRunConfig.from_args(
        home=str(tmp_path), dags_folder="dags", plugins_folder="plugins", port=8080, demo_days=1
    )
    harness = {k for k in environment(cfg, 8080, 8090) if k.startswith("AIRFLOW_CONN_ONCEFLOW_")}
    ours = {k for k in COMMON_ENV if k.startswith("AIRFLOW_CONN_")}
    assert ours == harness

    listening = _listening_ports()
    databases = set(re.search(r"for db in ([\w ]+); do", _init_script()).group(1).split())  # type: ignore[union-attr]
    for name in ("onceflow_ledger", "onceflow_warehouse", "onceflow_shop_db"):
        conn = _conn(name)
        assert conn.conn_type == "postgres" and conn.host == "postgres" and conn.port == 5432
        assert conn.schema in databases
    sheets = _conn("onceflow_sheets").extra_dejson
    endpoint = urlsplit(sheets["api_endpoint"])
    assert endpoint.port in listening[endpoint.hostname]
    storage = parse_config(_conn("onceflow_storage").extra_dejson, default_base="file:///unused")
    assert storage.base.startswith("gs://")  # the workers share no disk
    assert storage.publish_base.startswith("gs://")
    gcs = urlsplit(storage.endpoint or "")
    assert gcs.port in listening[gcs.hostname]
    bucket = urlsplit(storage.base).hostname
    init = _argv(SERVICES["fake-gcs-init"]["command"])
    assert init == ["--endpoint", storage.endpoint, "--bucket", bucket]
    policy = FetchPolicy.from_extras(_conn("onceflow_fetch").extra_dejson)
    assert policy.allow.allows_host(_site_host(), int(_option(SERVICES["article-site"], "--port")))


def _site_host() -> str:
    """The article site's name on the compose network: a dotted alias, as the claim wants hosts."""
    (alias,) = SERVICES["article-site"]["networks"]["default"]["aliases"]
    return str(alias)


def _option(service: dict[str, Any], flag: str) -> str:
    argv = _commands(service)[0]
    return argv[argv.index(flag) + 1]


def _listening_ports() -> dict[str, set[int]]:
    """Service name -> ports it listens on (its own ``--port``, or the ports it exposes)."""
    found: dict[str, set[int]] = {}
    for name, service in SERVICES.items():
        ports = {int(str(p).split(":")[-1]) for p in service.get("ports", [])}
        ports |= {int(p) for p in service.get("expose", [])}
        argv = _commands(service)[0] if name in OURS else _argv(service.get("command"))
        for flag in ("--port", "-port"):
            if flag in argv:
                ports.add(int(argv[argv.index(flag) + 1]))
        found[name] = ports
    return found


def test_pools_are_imported_from_onceflow_pools() -> None:
    commands = _commands(SERVICES["airflow-init"])
    pools_json = next(c for c in commands if c[:2] == ["onceflow", "pools"])
    imported = next(c for c in commands if c[:3] == ["airflow", "pools", "import"])
    assert commands.index(pools_json) < commands.index(imported)
    assert f"onceflow pools > {imported[3]}" in _init_script()
    # before the pools, the schema they live in; the ledger's own schema from its connection
    assert commands.index(["airflow", "db", "migrate"]) < commands.index(imported)
    assert ["onceflow", "ledger", "upgrade", "--conn-id", "onceflow_ledger"] in commands


def test_the_offline_sheet_is_the_harness_demo_sheet(tmp_path: Path) -> None:
    from onceflow.local_run import DEMO_NOT_A_URL, DEMO_SPREADSHEET_ID, SITE_PORT, _demo_sheet

    service = SERVICES["sheets-emulator"]
    seed = REPO / _mounts(service)[_option(service, "--seed")]
    harness = _demo_sheet(tmp_path / "demo.json", SITE_PORT).read_text()
    site = f"{_site_host()}:{_option(SERVICES['article-site'], '--port')}"
    expected = json.loads(harness.replace(f"127.0.0.1:{SITE_PORT}", site))
    seeded = json.loads(seed.read_text())
    assert seeded == expected
    # every demo URL but the harness's deliberate non-URL passes the claim's own check
    from onceflow.sheets.keys import InvalidUrl, normalise_url

    urls = [row[0] for row in seeded["sheets"]["queue"][1:]]
    refused = []
    for url in urls:
        try:
            normalise_url(url)
        except InvalidUrl:
            refused.append(url)
    assert refused == [DEMO_NOT_A_URL]
    assert _conn("onceflow_sheets").extra_dejson["spreadsheet_id"] == DEMO_SPREADSHEET_ID


def test_dockerfile_builds_the_locked_airflow_with_the_wheel_and_apertium() -> None:
    text = (REPO / "Dockerfile").read_text()
    default = re.search(r"^ARG AIRFLOW_VERSION=(\S+)$", text, re.M)
    assert default and default.group(1) == installed_version("apache-airflow")
    assert text.count("FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}") == 2
    apt = re.search(r"apt-get install [^\n]*", text)
    assert apt and {"apertium", "apertium-eng-spa"} <= set(apt.group(0).split())
    assert "airflow_provider_onceflow-*.whl)[all]" in text and "--constraint" in text
    watchdog = _argv(SERVICES["onceflow-watchdog"]["command"])[1]
    assert f"deploy/watchdog.toml {watchdog}" in text
