"""``StorageHook``: the object storage of onceflow, behind connection ``onceflow_storage``.

Two users: the article chain keeps its step outputs and publishes its pages here, and
``daily_sales`` stages its files between extract, clean and load here (under
``<base>/sales-staging``, or ``$ONCEFLOW_SALES_STAGING_DIR``: :meth:`StorageHook.sales_staging`),
so Celery workers on several hosts need no shared disk. Both go through :meth:`StorageHook.path`
(an ``ObjectStoragePath`` on this connection's filesystem) and :mod:`onceflow.objects` (one
object written whole: temp file and rename locally, one upload on GCS).

Connection ``onceflow_storage`` (type ``onceflow_storage``, whose form has a field per extra, or
any other type; a ``google_cloud_platform`` one lends its credentials to ``gs://``), extras:

* ``base``: URI of the step outputs and the sales staging, ``file:///abs/path`` or
  ``gs://bucket/prefix``;
* ``publish_base``: URI of the published pages (default ``<base>/published``);
* ``public_url``: URL prefix under which ``publish_base`` is reachable (default
  ``https://storage.googleapis.com/<bucket>/<prefix>`` for ``gs://``, the ``file://`` URI itself
  for local files; ``make run`` sets the demo site's ``http://127.0.0.1:<port>/published``);
* ``endpoint``: a GCS emulator (``http://127.0.0.1:4443``); ``STORAGE_EMULATOR_HOST`` is honoured
  too. With an endpoint the requests are anonymous, as emulators want.

Without the connection, everything is local under ``$ONCEFLOW_STORAGE_DIR``, else
``$AIRFLOW_HOME/onceflow/storage`` (the embedded default). See ``docs/articles.md#storage`` and
``docs/daily-sales.md#between-the-tasks``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from airflow.sdk import BaseHook

from onceflow.compat import AirflowNotFoundException
from onceflow.hooks.warehouse import embedded_dir
from onceflow.objects import StorageUriError, parse_storage_uri, storage_path

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

    from onceflow.articles.publish import Publisher
    from onceflow.articles.storage import StepStore

STORAGE_DIR_ENV = "ONCEFLOW_STORAGE_DIR"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class StorageConfigError(StorageUriError):
    """A ``onceflow_storage`` extra is not usable; the message names the key."""


@dataclass(frozen=True)
class StorageConfig:
    """The validated extras of ``onceflow_storage`` (defaults filled in)."""

    base: str
    publish_base: str
    public_url: str
    endpoint: str | None = None
    project: str | None = None


def _storage_uri(key: str, value: Any) -> str:
    """``file:///abs/path`` or ``gs://bucket[/prefix]``, without a trailing slash."""
    return parse_storage_uri(value, f"onceflow_storage extra {key!r}", StorageConfigError)


def _http_prefix(key: str, value: Any, schemes: tuple[str, ...]) -> str:
    if not isinstance(value, str) or urlsplit(value.strip()).scheme not in schemes:
        raise StorageConfigError(
            f"onceflow_storage extra {key!r} must be a URL starting with {' or '.join(s + '://' for s in schemes)}, "
            f"got {value!r}"
        )
    parts = urlsplit(value.strip())
    if parts.scheme != "file" and not parts.netloc:
        raise StorageConfigError(f"onceflow_storage extra {key!r} has no host: {value!r}")
    return value.strip().rstrip("/")


def default_public_url(publish_base: str) -> str:
    """Where ``publish_base`` is reachable when ``public_url`` is not set."""
    if publish_base.startswith("gs://"):
        return "https://storage.googleapis.com/" + publish_base[len("gs://") :]
    return publish_base


def parse_config(extras: dict[str, Any], default_base: str) -> StorageConfig:
    """Validate the connection's extras and fill in the defaults.

    :param extras: the connection's ``extra_dejson`` (``{}`` without a connection).
    :param default_base: ``base`` when the extras name none.
    :raises StorageConfigError: naming the extra that is wrong.
    """
    base = _storage_uri("base", extras.get("base") or default_base)
    publish_base = _storage_uri("publish_base", extras.get("publish_base") or f"{base}/published")
    public_url = (
        _http_prefix("public_url", extras["public_url"], ("http", "https", "file"))
        if extras.get("public_url")
        else default_public_url(publish_base)
    )
    from_env = os.environ.get(EMULATOR_ENV, "").strip()
    # "default" is how google-cloud-storage and gcsfs spell "not set"
    endpoint = extras.get("endpoint") or (from_env if from_env not in ("", "default") else None)
    if endpoint is not None:
        if isinstance(endpoint, str) and "://" not in endpoint:
            endpoint = f"http://{endpoint}"  # STORAGE_EMULATOR_HOST may be host:port
        endpoint = _http_prefix("endpoint", endpoint, ("http", "https"))
    project = extras.get("project")
    if project is not None and not isinstance(project, str):
        raise StorageConfigError(f"onceflow_storage extra 'project' must be a string, got {project!r}")
    return StorageConfig(base, publish_base, public_url, endpoint, project)


def default_base() -> str:
    """``file://$ONCEFLOW_STORAGE_DIR``, else ``file://$AIRFLOW_HOME/onceflow/storage``."""
    configured = os.environ.get(STORAGE_DIR_ENV)
    root = Path(configured).expanduser().resolve() if configured else embedded_dir() / "storage"
    return root.as_uri()


class StorageHook(BaseHook):
    """Step outputs (:class:`~onceflow.articles.storage.StepStore`), the publisher
    (:class:`~onceflow.articles.publish.Publisher`) and the sales staging
    (:meth:`sales_staging`) behind one Airflow connection.

    :param storage_conn_id: Airflow connection id (default ``onceflow_storage``).
    """

    conn_name_attr: ClassVar[str] = "storage_conn_id"
    default_conn_name: ClassVar[str] = "onceflow_storage"
    conn_type: ClassVar[str] = "onceflow_storage"
    hook_name: ClassVar[str] = "onceflow storage"

    def __init__(self, storage_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.storage_conn_id = storage_conn_id

    @cached_property
    def connection(self) -> Any | None:
        """The Airflow connection, or ``None`` when it is not defined anywhere."""
        try:
            return self.get_connection(self.storage_conn_id)
        except AirflowNotFoundException:
            return None

    @cached_property
    def config(self) -> StorageConfig:
        """The storage settings read from the connection's extras (local files under the default base without one)."""
        from onceflow.connection_types import filled

        extras = filled(self.connection.extra_dejson) if self.connection is not None else {}
        config = parse_config(extras, default_base())
        if self.connection is None:
            self.log.info("connection %r not defined; storing under %s", self.storage_conn_id, config.base)
        return config

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button: the validated fields, or which one is wrong and why."""
        try:
            config = self.config
        except StorageConfigError as exc:
            return False, str(exc)
        return True, f"step outputs under {config.base}, pages under {config.publish_base}"

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

    # -- step outputs (ObjectStoragePath) ----------------------------------------------------------

    def path(self, uri: str) -> ObjectStoragePath:
        """``uri`` as an ``ObjectStoragePath`` whose filesystem is this connection's.

        :param uri: ``gs://bucket/key``, ``file:///abs/path`` (read percent-decoded) or a plain
            absolute path (a local file; what older XComs of daily_sales carry). A local one never
            reads the connection.
        """
        from airflow.sdk import ObjectStoragePath

        if uri.startswith(("gs://", "gcs://")):
            store_id = self._attach_gcs()
            return ObjectStoragePath(uri, conn_id=store_id)
        return storage_path(uri)

    def _attach_gcs(self) -> str:
        """Register this connection's GCS filesystem in Airflow's store cache; its store id.

        ``ObjectStoragePath`` finds its filesystem through ``attach(protocol, conn_id)``, cached
        per process. We put ours there (again on every call, so a changed endpoint wins) because
        Airflow would build it without our endpoint.
        """
        from airflow.sdk.io.store import attach

        store = attach("gs", conn_id=self.storage_conn_id)
        store.fs = self.gcs_filesystem()  # replaces the cached_property's value
        return self.storage_conn_id

    def gcs_filesystem(self) -> Any:
        """A gcsfs filesystem for this connection.

        Against an endpoint (an emulator): gcsfs's core ``GCSFileSystem``, anonymous. gcsfs's
        default class (``ExtendedGcsFileSystem``) first asks the Storage Control gRPC API for the
        bucket's layout, which no emulator serves: 60 s of retries per call. Against Google:
        providers-google's ``get_fs`` with the connection's credentials.
        """
        endpoint = self.config.endpoint
        if endpoint is not None:
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem(
                endpoint_url=endpoint, token="anon", project=self.config.project or "onceflow"
            )
        from airflow.providers.google.cloud.fs.gcs import get_fs

        conn_id = self.storage_conn_id if self.connection is not None else None
        return get_fs(conn_id)

    def step_store(self) -> StepStore:
        """The step outputs under ``base``."""
        from onceflow.articles.storage import StepStore

        return StepStore(self.path(self.config.base))

    def sales_staging(self) -> ObjectStoragePath:
        """The base of daily_sales' staging folders (:func:`onceflow.sales.staging.base_uri`):
        ``$ONCEFLOW_SALES_STAGING_DIR``, else ``<base>/sales-staging``.

        :raises onceflow.sales.staging.StagingConfigError: the variable is not an absolute path,
            ``file:///`` or ``gs://`` URI; the message names it.
        """
        from onceflow.sales.staging import base_uri

        return self.path(base_uri(lambda: self.config.base))

    # -- publishing (google-cloud-storage for its ifGenerationMatch) --------------------------------

    def gcs_client(self) -> Any:
        """A google-cloud-storage client for this connection (anonymous against an endpoint)."""
        from google.cloud import storage

        endpoint = self.config.endpoint
        if endpoint is not None:
            from google.auth.credentials import AnonymousCredentials

            return storage.Client(
                project=self.config.project or "onceflow",
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": endpoint},
            )
        if self.connection is None:
            return storage.Client(project=self.config.project)
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(gcp_conn_id=self.storage_conn_id).get_conn()

    def publisher(self) -> Publisher:
        """The create-only publisher of pages under ``publish_base``."""
        from onceflow.articles.publish import Publisher

        base = self.config.publish_base
        client = self.gcs_client() if base.startswith("gs://") else None
        return Publisher(base, self.config.public_url, gcs_client=client)
