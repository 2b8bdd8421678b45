"""``TranslateHook``: the translation backend named by the Airflow connection ``onceflow_translate``.

The connection's extras choose the backend (type ``onceflow_translate``, whose form has a field per
extra, or any other type; ``generic`` is fine):

``{"backend": "apertium"}`` (the embedded default, used when the connection does not exist)
    ``mode``: an Apertium mode such as ``spa-eng`` (default: from the article's languages, es->en
    gives ``spa-eng``); ``mark_unknown`` (default true: keep ``*`` before unknown words for the
    score and polish steps); ``timeout`` seconds per chunk; ``max_chars`` per chunk (10,000).
``{"backend": "google", "project_id": "..."}``
    ``location`` (``global``), ``endpoint`` (a stub or private endpoint; anonymous credentials
    then), ``gcp_conn_id`` (a ``google_cloud_platform`` connection whose credentials to use; without
    it and without ``endpoint``, Application Default Credentials), ``glossary`` (a glossary id),
    ``timeout`` seconds per request, ``max_chars`` per chunk (5,000; at most 30,000).

A bad extra raises :class:`TranslateConfigError` naming the key and the value.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

from onceflow.compat import AirflowNotFoundException

if TYPE_CHECKING:
    from onceflow.articles.translate.base import Translation, Translator

APERTIUM_MAX_CHARS = 10_000
_KEYS = {
    "apertium": {"backend", "mode", "mark_unknown", "timeout", "max_chars"},
    "google": {
        "backend",
        "project_id",
        "location",
        "endpoint",
        "gcp_conn_id",
        "glossary",
        "timeout",
        "max_chars",
    },
}


class TranslateConfigError(ValueError):
    """The ``onceflow_translate`` connection's extras are wrong; the message names the key."""


class TranslateHook(BaseHook):
    """Build the translator that the connection's extras describe.

    :param conn_id: Airflow connection id (default ``onceflow_translate``).
    """

    conn_name_attr: ClassVar[str] = "conn_id"
    default_conn_name: ClassVar[str] = "onceflow_translate"
    conn_type: ClassVar[str] = "onceflow_translate"
    hook_name: ClassVar[str] = "onceflow translation backend"

    def __init__(self, conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    @cached_property
    def extras(self) -> dict[str, Any]:
        """The validated extras (``{"backend": "apertium"}`` when the connection does not exist)."""
        try:
            connection = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            self.log.info(
                "connection %r not defined; translating with Apertium (embedded default)", self.conn_id
            )
            return {"backend": "apertium"}
        from onceflow.connection_types import filled

        return validate_extras(filled(connection.extra_dejson), self.conn_id)

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button: the backend the fields describe, or which field is wrong."""
        try:
            return True, f"backend {self.backend}"
        except TranslateConfigError as exc:
            return False, str(exc)

    # -- the connection form (onceflow.connection_types; Airflow 3.2+ reads the provider info) --

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The connection form's extra fields for this connection type (``onceflow.connection_types``)."""
        from onceflow.connection_types import form_widgets

        return form_widgets(cls.conn_type)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Which standard connection fields the form hides or relabels for this type."""
        from onceflow.connection_types import field_behaviour

        return field_behaviour(cls.conn_type)

    @property
    def backend(self) -> str:
        """The configured backend: ``apertium`` or ``google``."""
        return str(self.extras["backend"])

    @property
    def max_chars(self) -> int:
        """Code points per chunk for this backend (the connection's ``max_chars`` when set)."""
        from onceflow.articles.translate.google_v3 import MAX_CHARS

        default = APERTIUM_MAX_CHARS if self.backend == "apertium" else MAX_CHARS
        return int(self.extras.get("max_chars", default))

    def get_translator(self, source: str, target: str) -> Translator:
        """The backend for ``source`` -> ``target`` (ISO 639-1 codes)."""
        extras = self.extras
        timeout = float(extras.get("timeout", 120.0 if self.backend == "apertium" else 60.0))
        if self.backend == "apertium":
            from onceflow.articles.translate.apertium import ApertiumTranslator

            mark = bool(extras.get("mark_unknown", True))
            if "mode" in extras:
                return ApertiumTranslator(str(extras["mode"]), mark_unknown=mark, timeout=timeout)
            return ApertiumTranslator.for_languages(source, target, mark_unknown=mark, timeout=timeout)
        from onceflow.articles.translate.google_v3 import GoogleTranslator

        credentials = None
        if extras.get("gcp_conn_id"):
            from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

            credentials = GoogleBaseHook(gcp_conn_id=str(extras["gcp_conn_id"])).get_credentials()
        return GoogleTranslator(
            str(extras["project_id"]),
            location=str(extras.get("location", "global")),
            endpoint=extras.get("endpoint") or None,
            credentials=credentials,
            glossary=extras.get("glossary") or None,
            timeout=timeout,
        )

    def translate(self, text: str, source: str, target: str) -> Translation:
        """Chunk, translate and reassemble ``text`` with this connection's backend."""
        from onceflow.articles.translate.base import translate_text

        return translate_text(
            self.get_translator(source, target), text, source, target, max_chars=self.max_chars
        )


def _positive(extras: dict[str, Any], key: str, conn_id: str, *, most: float | None = None) -> None:
    if key not in extras:
        return
    value = extras[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if ok and key == "max_chars":
        ok = isinstance(value, int)
    if ok and most is not None:
        ok = value <= most
    if not ok:
        bound = f" of at most {most:g}" if most is not None else ""
        raise TranslateConfigError(
            f"connection {conn_id!r}: extra {key!r} must be a positive number{bound}, not {value!r}"
        )


def validate_extras(extras: dict[str, Any], conn_id: str = TranslateHook.default_conn_name) -> dict[str, Any]:
    """Check the extras of a translate connection; returns them with ``backend`` filled in.

    :raises TranslateConfigError: naming the first bad key and its value.
    """
    from onceflow.articles.translate.apertium import mode_pair
    from onceflow.articles.translate.google_v3 import MAX_CODEPOINTS_PER_REQUEST

    extras = {"backend": "apertium", **extras}
    backend = extras["backend"]
    if backend not in _KEYS:
        raise TranslateConfigError(
            f"connection {conn_id!r}: extra 'backend' must be one of {sorted(_KEYS)}, not {backend!r}"
        )
    unknown = sorted(set(extras) - _KEYS[backend])
    if unknown:
        raise TranslateConfigError(
            f"connection {conn_id!r}: unknown extra {unknown[0]!r} for backend {backend!r} "
            f"(known: {', '.join(sorted(_KEYS[backend]))})"
        )
    _positive(extras, "timeout", conn_id)
    _positive(extras, "max_chars", conn_id, most=MAX_CODEPOINTS_PER_REQUEST if backend == "google" else None)
    if backend == "apertium":
        if "mode" in extras:
            try:
                mode_pair(str(extras["mode"]))
            except ValueError as exc:
                raise TranslateConfigError(f"connection {conn_id!r}: extra 'mode': {exc}") from None
        if "mark_unknown" in extras and not isinstance(extras["mark_unknown"], bool):
            raise TranslateConfigError(
                f"connection {conn_id!r}: extra 'mark_unknown' must be true or false, not {extras['mark_unknown']!r}"
            )
        return extras
    for key in ("project_id", "location", "endpoint", "gcp_conn_id", "glossary"):
        value = extras.get(key)
        if key == "project_id" and not value:
            raise TranslateConfigError(f"connection {conn_id!r}: backend 'google' needs extra 'project_id'")
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise TranslateConfigError(
                f"connection {conn_id!r}: extra {key!r} must be a non-empty string, not {value!r}"
            )
    endpoint = extras.get("endpoint")
    if endpoint is not None and not str(endpoint).startswith(("http://", "https://")):
        raise TranslateConfigError(
            f"connection {conn_id!r}: extra 'endpoint' must be an http(s) URL, not {endpoint!r}"
        )
    return extras
