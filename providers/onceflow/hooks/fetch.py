"""``FetchHook``: the fetch step's policy from the Airflow connection ``onceflow_fetch``.

The connection (type ``onceflow_fetch``, whose form has a field per extra, or ``generic``; only
its extras are read) sets the limits and the allow-list of
:class:`~onceflow.articles.fetch.FetchPolicy`::

    AIRFLOW_CONN_ONCEFLOW_FETCH='{"conn_type": "generic",
        "extra": {"allow": ["127.0.0.1:8765"], "max_bytes": 5000000, "total_timeout": 60}}'

Without the connection the defaults apply and nothing private is reachable. Bad extras raise
``ValueError`` naming each bad key and value: a configuration error, not the article's fault.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

from onceflow.compat import AirflowNotFoundException

if TYPE_CHECKING:
    from onceflow.articles.fetch import FetchedPage, FetchPolicy


class FetchHook(BaseHook):
    """Fetch article pages under the policy the connection describes.

    :param conn_id: Airflow connection id (default ``onceflow_fetch``).
    """

    conn_name_attr: ClassVar[str] = "conn_id"
    default_conn_name: ClassVar[str] = "onceflow_fetch"
    conn_type: ClassVar[str] = "onceflow_fetch"
    hook_name: ClassVar[str] = "onceflow article fetch"

    def __init__(self, conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    @cached_property
    def policy(self) -> FetchPolicy:
        """The validated policy (the defaults, with an empty allow-list, without a connection)."""
        from onceflow.articles.fetch import FetchPolicy
        from onceflow.connection_types import filled

        try:
            connection = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            self.log.info("connection %r not defined; fetching with the default policy", self.conn_id)
            return FetchPolicy()
        try:
            return FetchPolicy.from_extras(filled(connection.extra_dejson))
        except ValueError as exc:
            raise ValueError(f"connection {self.conn_id!r}: {exc}") from exc

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button: the policy the fields describe, or what is wrong with which one."""
        try:
            policy = self.policy
        except ValueError as exc:
            return False, str(exc)
        return (
            True,
            f"fetch policy: {len(policy.allow.entries)} allow-list entries, max {policy.max_bytes} bytes",
        )

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

    def fetch(self, url: str) -> FetchedPage:
        """GET ``url`` (see :func:`onceflow.articles.fetch.fetch_page` for what it raises)."""
        from onceflow.articles.fetch import fetch_page

        return fetch_page(url, self.policy)
