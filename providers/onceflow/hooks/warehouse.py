"""Hooks for the daily_sales databases: the warehouse (``onceflow_warehouse``) and the shop
database (``onceflow_shop_db``).

Both resolve an Airflow connection to a SQLAlchemy engine: ``postgres``/``postgresql`` connections
(driver ``psycopg2`` unless the extra ``{"driver": "psycopg"}`` says otherwise), ``sqlite``
connections (the file path in ``host``), or any connection whose extra carries
``{"sqlalchemy_url": ...}``. When the connection does not exist at all, the embedded default is a
SQLite file under ``$AIRFLOW_HOME/onceflow/`` (``warehouse.db``, ``shop.db``), so the DAG runs on a
laptop with no setup. A ``google_cloud_platform`` warehouse connection means BigQuery
(:meth:`WarehouseHook.overwrite_bigquery_partition`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

from onceflow.compat import AirflowNotFoundException

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import pandas as pd
    from sqlalchemy.engine import Engine

    from onceflow.sales.fencing import Lease
    from onceflow.sales.partition_store import PartitionStore
    from onceflow.sales.shop_query import OrderColumns, SourceExtract

BIGQUERY_CONN_TYPES = frozenset({"google_cloud_platform", "gcpbigquery"})


def embedded_dir() -> Path:
    """``$AIRFLOW_HOME/onceflow``: where the embedded SQLite defaults live."""
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return Path(home) / "onceflow"


def connection_url(conn: Any) -> str:
    """SQLAlchemy URL of an Airflow connection to PostgreSQL or SQLite.

    :param conn: an Airflow ``Connection``.
    :raises ValueError: for connection types that are not SQL databases.
    """
    from sqlalchemy.engine import URL

    extra = conn.extra_dejson or {}
    if extra.get("sqlalchemy_url"):
        return str(extra["sqlalchemy_url"])
    conn_type = (conn.conn_type or "").lower().replace("-", "_")
    if conn_type.startswith("postgres"):
        driver = extra.get("driver") or (conn_type.split("+", 1)[1] if "+" in conn_type else "psycopg2")
        return URL.create(
            f"postgresql+{driver}",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host or None,
            port=conn.port or None,
            database=conn.schema or None,
        ).render_as_string(hide_password=False)
    if conn_type == "sqlite":
        path = conn.host or conn.schema
        if not path:
            raise ValueError(f"sqlite connection {conn.conn_id!r} has no file path in host")
        return f"sqlite:///{path}"
    raise ValueError(f"connection {conn.conn_id!r} of type {conn.conn_type!r} is not PostgreSQL or SQLite")


class _SqlConnectionHook(BaseHook):
    """Shared part: connection id -> SQLAlchemy URL -> cached engine, with an embedded default."""

    conn_name_attr: ClassVar[str]
    default_conn_name: ClassVar[str]
    embedded_file: ClassVar[str]

    def __init__(self, conn_id: str | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name

    @cached_property
    def connection(self) -> Any | None:
        """The Airflow connection, or None when it is not defined anywhere."""
        try:
            return self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            return None

    def get_url(self) -> str:
        """SQLAlchemy URL: from the connection, or the embedded SQLite file when it is missing."""
        if self.connection is None:
            path = embedded_dir() / self.embedded_file
            path.parent.mkdir(parents=True, exist_ok=True)
            self.log.info("connection %r not defined; using embedded SQLite %s", self.conn_id, path)
            return f"sqlite:///{path}"
        return connection_url(self.connection)

    @cached_property
    def engine(self) -> Engine:
        from onceflow.sales.engine import make_engine

        return make_engine(self.get_url())

    def get_conn(self) -> Engine:
        """The SQLAlchemy engine (Airflow's hook protocol)."""
        return self.engine


class ShopDbHook(_SqlConnectionHook):
    """The shop database holding the ``orders`` table (connection ``onceflow_shop_db``).

    :param shop_db_conn_id: Airflow connection id.
    """

    conn_name_attr = "shop_db_conn_id"
    default_conn_name = "onceflow_shop_db"
    conn_type = "postgres"
    hook_name = "onceflow shop database"
    embedded_file = "shop.db"

    def __init__(self, shop_db_conn_id: str = default_conn_name) -> None:
        super().__init__(shop_db_conn_id)

    @cached_property
    def engine(self) -> Engine:
        """Read-only: a SQLite shop file is never locked for writing nor switched to WAL."""
        from onceflow.sales.engine import make_source_engine

        return make_source_engine(self.get_url())

    def read_interval(self, start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
        """Orders whose event time is in the half-open interval ``[start, end)``, by row id.

        :param start: aware interval start (inclusive).
        :param end: aware interval end (exclusive).
        """
        return self.read_interval_snapshot(start, end).frame

    def read_interval_snapshot(self, start: dt.datetime, end: dt.datetime) -> SourceExtract:
        """The orders of ``[start, end)`` and the shop's clock, read in one snapshot.

        The watermark is the shop database's own time at the start of the read (naive UTC), so
        every row committed before it is in the frame. On PostgreSQL extracts of one shop compare
        without trusting the workers' clocks; SQLite computes ``'now'`` in the reading process, so
        there it is the worker's clock (readers of one SQLite shop must share one clock).
        """
        from onceflow.sales.shop_query import read_interval_snapshot

        return read_interval_snapshot(self.engine, start, end)

    def stream_interval(
        self, start: dt.datetime, end: dt.datetime
    ) -> contextlib.AbstractContextManager[tuple[dt.datetime, Iterator[OrderColumns]]]:
        """:meth:`read_interval_snapshot` batch by batch (:func:`onceflow.sales.shop_query.stream_interval`):
        the watermark and an iterator of batches (:func:`~onceflow.sales.shop_query.rows_columns`),
        valid inside the ``with`` block."""
        from onceflow.sales.shop_query import stream_interval

        return stream_interval(self.engine, start, end)


class WarehouseHook(_SqlConnectionHook):
    """The warehouse: partition overwrites, ``load_audit``, ``rejects`` (connection ``onceflow_warehouse``).

    :param warehouse_conn_id: Airflow connection id (PostgreSQL, SQLite, or Google Cloud for BigQuery).
    """

    conn_name_attr = "warehouse_conn_id"
    default_conn_name = "onceflow_warehouse"
    conn_type = "postgres"
    hook_name = "onceflow warehouse"
    embedded_file = "warehouse.db"

    def __init__(self, warehouse_conn_id: str = default_conn_name) -> None:
        super().__init__(warehouse_conn_id)

    @property
    def is_bigquery(self) -> bool:
        """Whether the warehouse connection is a BigQuery one (``daily_sales`` then loads through staging and a swap)."""
        conn = self.connection
        return conn is not None and (conn.conn_type or "").lower().replace("-", "_") in BIGQUERY_CONN_TYPES

    def get_store(self, table: str = "daily_sales", *, create: bool = True) -> PartitionStore:
        """The fenced partition store of ``table`` (created with its audit tables if missing).

        :param table: sales table name; refused unless a plain identifier.
        :param create: create the tables if they do not exist.
        """
        from onceflow.sales.partition_store import PartitionStore

        store = PartitionStore(self.engine, table)
        if create:
            store.create_schema()
        return store

    def overwrite_bigquery_partition(
        self,
        *,
        table: str,
        lease: Lease,
        rows: pd.DataFrame,
        project_id: str | None = None,
        dataset: str,
        location: str | None = None,
        source_watermark_utc: dt.datetime | None = None,
        checkpoint: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Replace one day partition of a BigQuery table, fenced at the sink.

        A load job stages the rows, then one multi-statement transaction checks BigQuery's own
        fence table and swaps the partition (:func:`onceflow.sales.bigquery.fenced_overwrite`).

        :param table: table name (plain identifier).
        :param lease: the attempt's lease (its partition and fence token).
        :param rows: sales rows of that day.
        :param project_id: GCP project (default: the connection's).
        :param dataset: BigQuery dataset.
        :param location: job location.
        :param source_watermark_utc: when the extract read the shop (naive UTC).
        :param checkpoint: called with ``"staged"`` between the two jobs.
        :raises StaleAttemptError: a newer attempt committed in BigQuery.
        :raises OlderExtractError: the partition holds a newer extract.
        :return: job ids, destination and output rows.
        """
        from airflow.providers.google.cloud.hooks.bigquery import BigQueryHook

        from onceflow.sales.bigquery import fenced_overwrite

        bq = BigQueryHook(gcp_conn_id=self.conn_id, location=location, use_legacy_sql=False)
        client = bq.get_client(project_id=project_id or bq.project_id, location=location)
        return fenced_overwrite(
            client,
            dataset=dataset,
            table=table,
            lease=lease,
            rows=rows,
            source_watermark_utc=source_watermark_utc,
            checkpoint=checkpoint,
        )
