"""The package registers itself as an Airflow provider, and lists everything it ships."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from typing import Any

import pytest

import onceflow
from onceflow.get_provider_info import get_provider_info

KINDS = {"hooks": "hooks", "operators": "operators", "sensors": "sensors", "triggers": "triggers"}


def _airflow(*args: str, airflow_env: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **airflow_env.variables}
    return subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_airflow_providers_get_lists_onceflow(airflow_env: Any) -> None:
    """The real CLI finds the provider through the apache_airflow_provider entry point."""
    proc = _airflow(
        "providers", "get", "airflow-provider-onceflow", "--output", "json", airflow_env=airflow_env
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout[proc.stdout.index("[") :])
    assert rows[0]["Provider"] == "airflow-provider-onceflow"
    assert rows[0]["Version"] == onceflow.__version__


def _declared_modules(kind: str) -> set[str]:
    info = get_provider_info()
    return {m for entry in info.get(kind, []) for m in entry.get("python-modules", [])}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_module_of_a_kind_is_declared(kind: str) -> None:
    package = importlib.import_module(f"onceflow.{KINDS[kind]}")
    shipped = {
        f"onceflow.{KINDS[kind]}.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if not m.name.startswith("_")
    }
    assert shipped == _declared_modules(kind)


def test_every_hook_uses_a_connection_type_an_installed_provider_registers() -> None:
    """onceflow declares four connection types with forms of their own (onceflow_fetch,
    onceflow_storage, onceflow_translate, onceflow_ledger: tests/integration/test_connection_types.py);
    its other hooks reuse ``postgres`` and ``google_cloud_platform``. Each hook's ``conn_type`` must
    be one the installed providers (onceflow included) register."""
    from airflow.sdk import BaseHook
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    declared = {c["connection-type"] for c in get_provider_info()["connection-types"]}
    assert declared == {"onceflow_fetch", "onceflow_storage", "onceflow_translate", "onceflow_ledger"}
    hooks = [
        cls
        for module in sorted(_declared_modules("hooks"))
        for cls in vars(importlib.import_module(module)).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseHook)
        and cls.__module__ == module
        and not cls.__name__.startswith("_")  # shared bases carry no conn_type
    ]
    assert {h.__name__ for h in hooks} >= {"LedgerHook", "SheetQueueHook", "WarehouseHook"}
    known = set(ProvidersManagerTaskRuntime().hooks)
    unknown = {h.__name__: h.conn_type for h in hooks if h.conn_type not in known}
    assert unknown == {}, f"hooks whose connection type no installed provider registers: {unknown}"


def test_notifications_and_plugins_import() -> None:
    info = get_provider_info()
    for path in info.get("notifications", []):
        module, _, name = path.rpartition(".")
        assert inspect.isclass(getattr(importlib.import_module(module), name))
    for plugin in info.get("plugins", []):
        module, _, name = plugin["plugin-class"].rpartition(".")
        assert inspect.isclass(getattr(importlib.import_module(module), name))
