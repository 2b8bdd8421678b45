"""onceflow's connection types: the forms Airflow's connection UI shows, the validation behind
them, and the ``generic`` connections written before the types existed.

The form is checked where the UI gets it: ``HookMetaService.hook_meta_data()`` is what Airflow
3.3's ``GET /ui/connections/hook_meta`` returns, read here in a fresh process (the provider
manager is a process-wide singleton). Airflow 3.1's way (the hooks' WTForms methods) is checked in
``tests/acceptance/test_airflow_versions.py`` on 3.1 itself.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from onceflow.connection_types import CONNECTION_TYPES, field_behaviour, filled

HOOK_META = """
import json
from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
found = {}
for meta in HookMetaService.hook_meta_data():
    if meta.connection_type.startswith("onceflow"):
        found[meta.connection_type] = json.loads(meta.model_dump_json())
print("META " + json.dumps(found))
"""

EXPECTED_FIELDS = {
    "onceflow_fetch": {
        "allow",
        "max_bytes",
        "max_redirects",
        "connect_timeout",
        "read_timeout",
        "total_timeout",
        "user_agent",
    },
    "onceflow_storage": {"base", "publish_base", "public_url", "endpoint", "project"},
    "onceflow_translate": {
        "backend",
        "mode",
        "mark_unknown",
        "project_id",
        "location",
        "endpoint",
        "gcp_conn_id",
        "glossary",
        "timeout",
        "max_chars",
    },
    "onceflow_ledger": {"sqlalchemy_url"},
}


@pytest.fixture(scope="module")
def hook_meta(airflow_env: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", HOOK_META],
        env={**os.environ, **airflow_env.variables},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("META "))
    return dict(json.loads(line[5:]))


def test_the_connection_ui_offers_each_type_with_its_fields(hook_meta: dict[str, Any]) -> None:
    assert set(hook_meta) == set(EXPECTED_FIELDS)
    for conn_type, fields in EXPECTED_FIELDS.items():
        meta = hook_meta[conn_type]
        assert meta["hook_class_name"].startswith("onceflow.hooks.")
        assert set(meta["extra_fields"]) == fields, conn_type
        for name, field in meta["extra_fields"].items():
            assert field["schema"]["title"], (conn_type, name)
            assert field["description"], (conn_type, name)
        # host, schema, port, login and password mean nothing to these types: hidden
        standard = meta["standard_fields"]
        assert {k for k, v in standard.items() if v and v["hidden"]} == {
            "host",
            "url_schema",
            "port",
            "login",
            "password",
        }, conn_type
    assert hook_meta["onceflow_ledger"]["extra_fields"]["sqlalchemy_url"]["schema"]["format"] == "password"
    assert hook_meta["onceflow_fetch"]["extra_fields"]["max_bytes"]["schema"]["type"] == ["integer", "null"]


def test_the_hooks_answer_airflow_3_1_from_the_same_definition() -> None:
    from onceflow.hooks.fetch import FetchHook
    from onceflow.hooks.ledger import LedgerHook
    from onceflow.hooks.storage import StorageHook
    from onceflow.hooks.translate import TranslateHook

    by_type = {c["connection-type"]: c for c in CONNECTION_TYPES}
    for hook in (FetchHook, StorageHook, TranslateHook, LedgerHook):
        entry = by_type[hook.conn_type]
        assert entry["hook-class-name"] == f"{hook.__module__}.{hook.__name__}"
        assert entry["hook-name"] == hook.hook_name
        assert hook.get_ui_field_behaviour() == field_behaviour(hook.conn_type)
        for method in ("get_connection_form_widgets", "get_ui_field_behaviour", "test_connection"):
            assert method in vars(hook), (hook.__name__, method)


# -- validation names the field -----------------------------------------------------------------------


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn_type: str, extra: dict[str, Any]) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": conn_type, "extra": extra})
    )


BAD_FIELDS = [
    ("onceflow_fetch", {"allow": "articles.example.org", "max_bytes": "lots"}, "max_bytes"),
    ("onceflow_fetch", {"total_timeout": -1}, "total_timeout"),
    ("onceflow_fetch", {"allow": "not a host/99"}, "allow"),
    ("onceflow_storage", {"base": "s3://bucket/steps"}, "'base'"),
    ("onceflow_storage", {"base": "gs://b/steps", "public_url": "ftp://x"}, "'public_url'"),
    ("onceflow_storage", {"base": "gs://b/steps", "endpoint": "ftp://emulator"}, "'endpoint'"),
    ("onceflow_translate", {"backend": "deepl"}, "'backend'"),
    ("onceflow_translate", {"backend": "google"}, "'project_id'"),
    ("onceflow_translate", {"backend": "apertium", "timeout": 0}, "timeout"),
    ("onceflow_ledger", {}, "'sqlalchemy_url' is empty"),
    ("onceflow_ledger", {"sqlalchemy_url": "not a url"}, "'sqlalchemy_url' is not a SQLAlchemy URL"),
    (
        "onceflow_ledger",
        {"sqlalchemy_url": "mysql://u@h/db"},
        "'sqlalchemy_url' must be postgresql or sqlite",
    ),
]


def _hook(conn_type: str, conn_id: str) -> Any:
    from onceflow.hooks.fetch import FetchHook
    from onceflow.hooks.ledger import LedgerHook
    from onceflow.hooks.storage import StorageHook
    from onceflow.hooks.translate import TranslateHook

    hooks = {
        "onceflow_fetch": FetchHook,
        "onceflow_storage": StorageHook,
        "onceflow_translate": TranslateHook,
        "onceflow_ledger": LedgerHook,
    }
    return hooks[conn_type](conn_id)


@pytest.mark.parametrize(("conn_type", "extra", "named"), BAD_FIELDS)
def test_the_test_button_names_the_wrong_field(
    monkeypatch: pytest.MonkeyPatch, conn_type: str, extra: dict[str, Any], named: str
) -> None:
    _conn(monkeypatch, "form_under_test", conn_type, extra)
    ok, message = _hook(conn_type, "form_under_test").test_connection()
    assert ok is False
    assert named in message, message


def test_the_tasks_refuse_the_same_connection_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.hooks.storage import StorageConfigError
    from onceflow.hooks.translate import TranslateConfigError

    _conn(monkeypatch, "bad_fetch", "onceflow_fetch", {"max_redirects": -3})
    with pytest.raises(ValueError, match="max_redirects"):
        _ = _hook("onceflow_fetch", "bad_fetch").policy
    _conn(monkeypatch, "bad_storage", "onceflow_storage", {"base": "relative/path"})
    with pytest.raises(StorageConfigError, match="'base'"):
        _ = _hook("onceflow_storage", "bad_storage").config
    _conn(monkeypatch, "bad_translate", "onceflow_translate", {"backend": "google", "max_chars": 99999})
    with pytest.raises(TranslateConfigError, match="max_chars"):
        _ = _hook("onceflow_translate", "bad_translate").extras
    _conn(monkeypatch, "bad_ledger", "onceflow_ledger", {"sqlalchemy_url": "oracle://x"})
    with pytest.raises(ValueError, match="sqlalchemy_url"):
        _hook("onceflow_ledger", "bad_ledger").get_url()


# -- what a filled-in form stores works, and so do the generic connections of before ------------------

# What the UI saves: every field of the form, the untouched ones null or empty.
FORMS = {
    "onceflow_fetch": {
        "allow": "articles.example.org, 127.0.0.1:8765",
        "max_bytes": 1000000,
        "max_redirects": None,
        "connect_timeout": None,
        "read_timeout": "",
        "total_timeout": 30,
        "user_agent": None,
    },
    "onceflow_storage": {
        "base": "gs://onceflow/steps",
        "publish_base": None,
        "public_url": "",
        "endpoint": "http://127.0.0.1:4443",
        "project": None,
    },
    "onceflow_translate": {
        "backend": "google",
        "mode": None,
        "mark_unknown": None,
        "project_id": "my-project",
        "location": "",
        "endpoint": None,
        "gcp_conn_id": None,
        "glossary": None,
        "timeout": 20,
        "max_chars": None,
    },
}
GENERIC = {conn_type: filled(form) for conn_type, form in FORMS.items()}
GENERIC["onceflow_fetch"]["allow"] = ["articles.example.org", "127.0.0.1:8765"]  # a list, as written by hand


def _seen(conn_type: str, conn_id: str) -> Any:
    hook = _hook(conn_type, conn_id)
    return {"onceflow_fetch": "policy", "onceflow_storage": "config", "onceflow_translate": "extras"}[
        conn_type
    ], hook


@pytest.mark.parametrize("conn_type", sorted(FORMS))
def test_a_form_and_an_old_generic_connection_give_the_same_settings(
    monkeypatch: pytest.MonkeyPatch, conn_type: str
) -> None:
    _conn(monkeypatch, "from_the_form", conn_type, FORMS[conn_type])
    _conn(monkeypatch, "written_by_hand", "generic", GENERIC[conn_type])
    attribute, form_hook = _seen(conn_type, "from_the_form")
    _, generic_hook = _seen(conn_type, "written_by_hand")
    assert form_hook.test_connection()[0] is True
    assert generic_hook.test_connection()[0] is True
    assert getattr(form_hook, attribute) == getattr(generic_hook, attribute)


def test_the_fetch_form_keeps_the_allow_list_and_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "from_the_form", "onceflow_fetch", FORMS["onceflow_fetch"])
    policy = _hook("onceflow_fetch", "from_the_form").policy
    assert policy.allow.allows_host("articles.example.org", 443)
    assert policy.allow.allows_address(ipaddress.ip_address("127.0.0.1"), 8765)
    assert not policy.allow.allows_address(ipaddress.ip_address("127.0.0.1"), 8766)
    assert (policy.max_bytes, policy.total_timeout, policy.max_redirects) == (1000000, 30.0, 5)


def test_a_ledger_connection_of_either_kind_opens_the_same_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    path = tmp_path / "ledger.db"
    _conn(monkeypatch, "ledger_form", "onceflow_ledger", {"sqlalchemy_url": f"sqlite:///{path}"})
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_SQLITE", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    _conn(monkeypatch, "ledger_generic", "generic", {"sqlalchemy_url": f"sqlite:///{path}"})
    urls = {_hook("onceflow_ledger", c).get_url() for c in ("ledger_form", "ledger_sqlite", "ledger_generic")}
    assert urls == {f"sqlite:///{path}"}
