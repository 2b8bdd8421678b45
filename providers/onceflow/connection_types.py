"""onceflow's connection types and the fields of their forms in Airflow's connection UI.

One definition, two ways Airflow reads it:

* Airflow 3.2+ reads ``conn-fields`` and ``ui-field-behaviour`` from the provider info
  (:data:`CONNECTION_TYPES`, listed by ``get_provider_info``) without importing the hooks;
* Airflow 3.1 imports each hook and calls ``get_connection_form_widgets()`` and
  ``get_ui_field_behaviour()``, which the hooks answer with :func:`form_widgets` and
  :func:`field_behaviour` from the same data.

The UI stores each field in the connection's extras under the field's name, which is the key the
hooks already read, so a ``generic`` connection with hand-written extras keeps working. A field
left blank arrives as ``null`` or ``""``: :func:`filled` drops those before the hooks validate,
and the hooks' errors name the field that is wrong. Plain data and no Airflow import at module
level: the provider info imports this in every Airflow process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_NO_STANDARD_FIELDS = ["host", "schema", "port", "login", "password"]
#: Every type's form: all its fields are declared in ``conn-fields``, so the standard ones are hidden.
_BEHAVIOUR: dict[str, Any] = {"hidden-fields": _NO_STANDARD_FIELDS, "relabeling": {}, "placeholders": {}}


def _field(label: str, kind: str, description: str, **schema: Any) -> dict[str, Any]:
    json_type = {"text": "string", "secret": "string", "int": "integer", "seconds": "number"}.get(kind, kind)
    spec: dict[str, Any] = {"type": [json_type, "null"], **schema}
    if kind == "secret":
        spec["format"] = "password"
    return {"label": label, "description": description, "schema": spec}


FETCH_FIELDS = {
    "allow": _field(
        "Allow-list",
        "text",
        "Hosts, host:port pairs or address ranges the fetch may reach besides public addresses, "
        "comma-separated (articles.example.org, 10.0.0.0/8, 127.0.0.1:8765)",
    ),
    "max_bytes": _field("Max bytes", "int", "Largest page body read (default 5000000)", minimum=1),
    "max_redirects": _field("Max redirects", "int", "Redirects followed (default 5)", minimum=0),
    "connect_timeout": _field("Connect timeout (s)", "seconds", "Per connection (default 5)"),
    "read_timeout": _field("Read timeout (s)", "seconds", "Between bytes (default 15)"),
    "total_timeout": _field("Total timeout (s)", "seconds", "Whole fetch (default 60)"),
    "user_agent": _field("User-Agent", "text", "User-Agent header of every request"),
}

STORAGE_FIELDS = {
    "base": _field(
        "Base URI",
        "text",
        "Step outputs and daily_sales' staging: gs://bucket/prefix (no shared disk between "
        "workers) or file:///absolute/path",
    ),
    "publish_base": _field("Publish base URI", "text", "Published pages (default <base>/published)"),
    "public_url": _field(
        "Public URL", "text", "URL prefix under which the publish base is reachable (http or https)"
    ),
    "endpoint": _field("GCS endpoint", "text", "A GCS emulator's URL; requests are then anonymous"),
    "project": _field("Project", "text", "Google Cloud project of the GCS client"),
}

TRANSLATE_FIELDS = {
    "backend": _field(
        "Backend",
        "text",
        "apertium (offline, Debian packages on the workers) or google (Cloud Translation v3)",
        enum=["apertium", "google", None],
    ),
    "mode": _field("Apertium mode", "text", "apertium: a mode such as spa-eng (default from the languages)"),
    "mark_unknown": _field("Mark unknown words", "boolean", "apertium: keep * before unknown words"),
    "project_id": _field("Project id", "text", "google: the Cloud project (required)"),
    "location": _field("Location", "text", "google: global (default) or a region"),
    "endpoint": _field("Endpoint", "text", "google: a private or stub endpoint (anonymous credentials)"),
    "gcp_conn_id": _field("GCP connection id", "text", "google: a google_cloud_platform connection"),
    "glossary": _field("Glossary", "text", "google: a glossary id"),
    "timeout": _field("Timeout (s)", "seconds", "Per chunk or request"),
    "max_chars": _field("Max characters per chunk", "int", "apertium 10000, google 5000 (at most 30000)"),
}

LEDGER_FIELDS = {
    "sqlalchemy_url": _field(
        "SQLAlchemy URL",
        "secret",
        "postgresql+psycopg2://user:password@host:5432/database, or sqlite:////absolute/path.db",
    ),
}

#: ``connection-types`` of the provider info, with Airflow 3.2+'s declarative form fields.
CONNECTION_TYPES: list[dict[str, Any]] = [
    {
        "connection-type": "onceflow_fetch",
        "hook-class-name": "onceflow.hooks.fetch.FetchHook",
        "hook-name": "onceflow article fetch",
        "ui-field-behaviour": _BEHAVIOUR,
        "conn-fields": FETCH_FIELDS,
    },
    {
        "connection-type": "onceflow_storage",
        "hook-class-name": "onceflow.hooks.storage.StorageHook",
        "hook-name": "onceflow storage",
        "ui-field-behaviour": _BEHAVIOUR,
        "conn-fields": STORAGE_FIELDS,
    },
    {
        "connection-type": "onceflow_translate",
        "hook-class-name": "onceflow.hooks.translate.TranslateHook",
        "hook-name": "onceflow translation backend",
        "ui-field-behaviour": _BEHAVIOUR,
        "conn-fields": TRANSLATE_FIELDS,
    },
    {
        "connection-type": "onceflow_ledger",
        "hook-class-name": "onceflow.hooks.ledger.LedgerHook",
        "hook-name": "onceflow work ledger",
        "ui-field-behaviour": _BEHAVIOUR,
        "conn-fields": LEDGER_FIELDS,
    },
]

_BY_TYPE = {entry["connection-type"]: entry for entry in CONNECTION_TYPES}


def filled(extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """The extras without the form's blank fields (``None`` or an empty string: the default)."""
    return {k: v for k, v in (extras or {}).items() if v is not None and v != ""}


def field_behaviour(connection_type: str) -> dict[str, Any]:
    """``get_ui_field_behaviour()`` for Airflow 3.1 (snake-case keys, as the hooks return it)."""
    behaviour = _BY_TYPE[connection_type]["ui-field-behaviour"]
    return {
        "hidden_fields": list(behaviour["hidden-fields"]),
        "relabeling": dict(behaviour["relabeling"]),
        "placeholders": dict(behaviour["placeholders"]),
    }


def form_widgets(connection_type: str) -> dict[str, Any]:
    """``get_connection_form_widgets()`` for Airflow 3.1: WTForms fields built from the same data
    (imported here: only the UI asks, and Airflow 3.1 stands in for WTForms when it is missing)."""
    from flask_appbuilder.fieldwidgets import BS3PasswordFieldWidget, BS3TextFieldWidget
    from flask_babel import lazy_gettext
    from wtforms import BooleanField, IntegerField, PasswordField, StringField
    from wtforms.validators import Optional

    widgets: dict[str, Any] = {}
    for name, spec in _BY_TYPE[connection_type]["conn-fields"].items():
        schema, label = spec["schema"], lazy_gettext(spec["label"])
        kind = schema["type"][0]
        if kind == "boolean":
            widgets[name] = BooleanField(label, description=spec["description"])
        elif kind == "integer":
            widgets[name] = IntegerField(
                label, validators=[Optional()], widget=BS3TextFieldWidget(), description=spec["description"]
            )
        elif schema.get("format") == "password":
            widgets[name] = PasswordField(
                label, widget=BS3PasswordFieldWidget(), description=spec["description"]
            )
        else:  # strings and seconds (3.1's form has no number field)
            widgets[name] = StringField(label, widget=BS3TextFieldWidget(), description=spec["description"])
    return widgets
