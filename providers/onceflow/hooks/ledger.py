"""``LedgerHook``: the work ledger behind the Airflow connection ``onceflow_ledger``, and the two
Airflow sinks of the outbox relay.

The connection resolves to a SQLAlchemy URL like the warehouse's: a ``postgres`` connection
(``postgresql+psycopg2://login:password@host:port/schema``), a ``sqlite`` connection (the file
path in ``host``), or any connection whose extra holds ``{"sqlalchemy_url": "..."}`` (the one field of
the ``onceflow_ledger`` connection type's form). When the
connection is not defined anywhere, the ledger is an embedded SQLite file,
``$AIRFLOW_HOME/onceflow/ledger.db``, so a laptop needs no setup; use PostgreSQL as soon as
more than one machine runs workers.

Sinks (``onceflow.ledger.outbox.AirflowSink``):

* :class:`TaskSdkSink` works inside a running task (real workers and ``dag.test``): DAG runs go
  through the Task SDK's supervisor channel to the Execution API; Asset events are added to the
  task's ``AssetAlias`` outlet and recorded when the task succeeds (the relay operators confirm
  those outbox rows in their success callback, for the events :func:`events_recorded_by_task`
  finds recorded in Airflow).
* :class:`MetadataDbSink` writes Airflow's metadata database through its ORM, for code that may
  (the scheduler side, plugins, tests, maintenance scripts); Airflow 3 workers may not.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

from onceflow.compat import AirflowNotFoundException
from onceflow.hooks.warehouse import connection_url, embedded_dir

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from onceflow.ledger import Ledger

OUTBOX_ASSET_ALIAS = "onceflow-ledger-outbox"
EMBEDDED_FILE = "ledger.db"


class LedgerHook(BaseHook):
    """Open the work ledger named by an Airflow connection.

    :param ledger_conn_id: Airflow connection id (default ``onceflow_ledger``).
    """

    conn_name_attr: ClassVar[str] = "ledger_conn_id"
    default_conn_name: ClassVar[str] = "onceflow_ledger"
    conn_type: ClassVar[str] = "onceflow_ledger"
    hook_name: ClassVar[str] = "onceflow work ledger"

    def __init__(self, ledger_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id

    @cached_property
    def connection(self) -> Any | None:
        """The Airflow connection, or ``None`` when it is not defined anywhere."""
        try:
            return self.get_connection(self.ledger_conn_id)
        except AirflowNotFoundException:
            return None

    def get_url(self) -> str:
        """The ledger's SQLAlchemy URL (the embedded SQLite file when the connection is missing)."""
        if self.connection is None:
            path = embedded_dir() / EMBEDDED_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            self.log.info(
                "connection %r not defined; using the embedded ledger %s", self.ledger_conn_id, path
            )
            return f"sqlite:///{path}"
        if self.connection.conn_type == self.conn_type:
            return ledger_form_url(self.connection)
        return connection_url(self.connection)

    @cached_property
    def engine(self) -> Engine:
        """A SQLAlchemy engine on the ledger database (connections checked before use)."""
        from onceflow.ledger import create_ledger_engine

        return create_ledger_engine(self.get_url(), pool_pre_ping=True)

    def get_conn(self) -> Engine:
        """The SQLAlchemy engine (Airflow's hook protocol)."""
        return self.engine

    def get_ledger(self) -> Ledger:
        """The :class:`~onceflow.ledger.Ledger`, migrated to the newest schema."""
        from onceflow.ledger import Ledger

        return Ledger(self.engine)

    def test_connection(self) -> tuple[bool, str]:
        """Airflow UI "Test" button: connect and report the schema revision."""
        from onceflow.ledger.migrations import current_revision, head

        try:
            self.get_url()
        except ValueError as exc:
            return False, str(exc)
        try:
            return True, f"ledger schema revision {current_revision(self.engine)} (this code: {head()})"
        except Exception as exc:
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


def ledger_form_url(connection: Any) -> str:
    """The URL of an ``onceflow_ledger`` connection: its ``sqlalchemy_url`` field, checked.

    :raises ValueError: naming the field, when it is empty, not a URL, or not PostgreSQL/SQLite.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    value = (connection.extra_dejson or {}).get("sqlalchemy_url")
    where = f"connection {connection.conn_id!r} (type onceflow_ledger): field 'sqlalchemy_url'"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} is empty; e.g. postgresql+psycopg2://user:password@host:5432/ledger")
    try:
        url = make_url(value.strip())
    except ArgumentError as exc:
        raise ValueError(f"{where} is not a SQLAlchemy URL: {exc}") from None
    if url.get_backend_name() not in ("postgresql", "sqlite"):
        raise ValueError(f"{where} must be postgresql or sqlite, not {url.get_backend_name()!r}")
    return value.strip()


class TaskSdkSink:
    """Relay from inside a running task, without metadata-DB access (Airflow 3 workers).

    :param outlet_events: the task context's ``outlet_events``; the task must declare
        ``AssetAlias(OUTBOX_ASSET_ALIAS)`` among its outlets for Asset events.
    """

    def __init__(self, outlet_events: Any | None = None) -> None:
        self.outlet_events = outlet_events

    def trigger_dag_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> bool:
        """Create the run through the Task SDK's ``TriggerDagRun``; ``True`` when it exists afterwards (created now or before)."""
        from airflow.sdk.exceptions import ErrorType
        from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun
        from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

        response = SUPERVISOR_COMMS.send(TriggerDagRun(dag_id=dag_id, run_id=run_id, conf=conf))
        if isinstance(response, ErrorResponse):
            if response.error == ErrorType.DAGRUN_ALREADY_EXISTS:
                return False
            raise RuntimeError(f"triggering {dag_id}/{run_id} failed: {response.error} {response.detail}")
        return True

    def emit_asset_event(self, uri: str, extra: dict[str, Any]) -> bool:
        """Add the event to the task's outlet: recorded when the task succeeds, so not yet (``False``)."""
        from airflow.sdk import Asset, AssetAlias

        if self.outlet_events is None:
            raise RuntimeError("TaskSdkSink needs the task's outlet_events to emit Asset events")
        self.outlet_events[AssetAlias(OUTBOX_ASSET_ALIAS)].add(Asset(uri=uri), extra=extra)
        return False


def events_recorded_by_task(ti: Any, uris: Iterable[str], id_key: str) -> set[str]:
    """The event ids (``extra[id_key]``) Airflow holds for ``uris`` since the task ``ti`` started.

    Asked of the Execution API through the running task's supervisor channel. Airflow runs
    success callbacks even when it did not take the task's success report (the instance was
    marked failed or success meanwhile: a 409, or a 200 that records nothing), so an outlet's
    events are confirmed by finding them, never by the callback having run. Any recorded event
    with the id will do (an earlier pass's too): the delivery is durable either way.
    """
    from airflow.sdk.execution_time.comms import AssetEventsResult, GetAssetEventByAsset
    from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

    # the API server's clock stamps both; the margin covers servers whose clocks differ
    after = ti.start_date - dt.timedelta(minutes=5) if ti.start_date is not None else None
    found: set[str] = set()
    for uri in sorted(set(uris)):
        response = SUPERVISOR_COMMS.send(GetAssetEventByAsset(name=None, uri=uri, after=after))
        if not isinstance(response, AssetEventsResult):
            continue  # an unknown asset holds no event of ours
        for event in response.asset_events:
            event_id = (event.extra or {}).get(id_key)
            if isinstance(event_id, str):
                found.add(event_id)
    return found


class MetadataDbSink:
    """Relay by writing Airflow's metadata database directly (processes allowed to use the ORM)."""

    def trigger_dag_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> bool:
        """Create the run in Airflow's metadata database; ``True`` when it exists afterwards (created now or before)."""
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.exceptions import DagRunAlreadyExists
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from airflow.utils.types import DagRunTriggeredByType

        with create_session() as session:
            if DagRun.find(dag_id=dag_id, run_id=run_id, session=session):
                return False
            try:
                trigger_dag(
                    dag_id,
                    run_id=run_id,
                    conf=conf,
                    triggered_by=DagRunTriggeredByType.OPERATOR,
                    session=session,
                )
            except DagRunAlreadyExists:
                return False
        return True

    def emit_asset_event(self, uri: str, extra: dict[str, Any]) -> bool:
        """Record the event in the metadata DB now (``True``: durable when this returns)."""
        from airflow.assets.manager import AssetManager
        from airflow.models.asset import AssetModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            asset = session.scalar(select(AssetModel).where(AssetModel.uri == uri, AssetModel.active.has()))
            if asset is None:
                raise LookupError(f"no active Airflow asset with uri {uri!r}")
            AssetManager.register_asset_change(asset=asset, extra=extra, session=session)
        return True
