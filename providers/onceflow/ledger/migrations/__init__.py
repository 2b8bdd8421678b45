"""Alembic migrations of the ledger database, and :func:`migrate`, which every starter calls.

Laid out like the Alembic trees of Airflow's own providers with tables (FAB, Edge): ``env.py``,
``script.py.mako`` and ``versions/`` next to this module, and a version table of our own
(:data:`VERSION_TABLE`) so a ledger that shares a database with something else that uses
Alembic (Airflow's metadata database, say) keeps its own history.

:func:`migrate` decides from what it finds:

* an empty database: ``schema.metadata.create_all`` (the one schema definition) and a stamp of
  the newest revision, as Airflow does for a new metadata database;
* a ledger of the hand-written migrations (table ``schema_version``, versions 1 to 3): stamped
  ``ledger_v<N>`` and upgraded in place (``schema_version`` stays, marked complete, for workers of
  that release still starting during a rolling deployment);
* an Alembic-managed ledger: the missing revisions.

Everything happens in ONE transaction on the caller's engine. Concurrent starters are kept
apart by a PostgreSQL transaction-level advisory lock, or by SQLite's write lock (the ledger's
engines begin every transaction with ``BEGIN IMMEDIATE``); the loser of the race finds the
work done. A starter that finds the ledger current takes no lock at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.ledger.db import is_sqlite, prepare_engine
from onceflow.ledger.errors import LedgerSchemaError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection, Engine

#: The newest revision in ``versions/`` (``tests/integration/test_ledger_migrations.py`` checks
#: it is Alembic's head). A ledger found at it is current without importing Alembic, which costs
#: about 70 ms of CPU in every task process that builds a ``Ledger`` (where the scheduler does not
#: preload it); Alembic is imported only to upgrade, or to read a version table with several rows.
HEAD = "ledger_v7"
VERSION_TABLE = "onceflow_ledger_alembic_version"
LEGACY_VERSION_TABLE = "schema_version"
# Any constant; identifies the ledger's migration lock among other advisory locks.
_ADVISORY_LOCK_ID = 0x0CEF10
_HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Upgrade:
    """What :func:`migrate` did.

    :param before: the revision found (``None``: empty database; ``legacy:N`` for hand-written N).
    :param after: the revision now.
    :param created: the tables were created from the schema (an empty database).
    """

    before: str | None
    after: str
    created: bool

    @property
    def changed(self) -> bool:
        """Whether the upgrade created or changed the ledger's tables."""
        return self.created or self.before != self.after


@cache
def script_directory() -> ScriptDirectory:
    """Alembic's view of the ledger's revisions (``migrations/versions``)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(_HERE))


def head() -> str:
    """The newest revision of this code (:data:`HEAD`)."""
    return HEAD


def _config(conn: Connection) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_HERE))
    config.attributes["connection"] = conn
    return config


def _revision(conn: Connection) -> str | None:
    # Every Ledger() reads this (each load task builds one): one catalog query and one read, not
    # an Inspector's and Alembic's catalog queries (eight on PostgreSQL, about 15 ms a task).
    present = _present_tables(conn, (VERSION_TABLE, LEGACY_VERSION_TABLE))
    if VERSION_TABLE in present:
        stamped = conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalars().all()
        if len(stamped) == 1:
            return str(stamped[0])
        if stamped:  # several heads: Alembic's own reading raises its error
            from alembic.runtime.migration import MigrationContext

            found = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
            if found is not None:
                return found
    if LEGACY_VERSION_TABLE in present:
        legacy = conn.exec_driver_sql(f"SELECT MAX(version) FROM {LEGACY_VERSION_TABLE}").scalar()
        if legacy is not None:
            return f"legacy:{int(legacy)}"
    return None


def _present_tables(conn: Connection, names: tuple[str, ...]) -> set[str]:
    """Which of ``names`` are tables the connection's unqualified statements would reach."""
    if is_sqlite(conn):
        query = sa.text("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN :names").bindparams(
            sa.bindparam("names", expanding=True)
        )
        return set(conn.execute(query, {"names": list(names)}).scalars())
    query = sa.text(
        "SELECT t.name FROM unnest(CAST(:names AS text[])) AS t(name) "
        "JOIN pg_class c ON c.oid = to_regclass(t.name) AND c.relkind IN ('r', 'p')"
    )
    return set(conn.execute(query, {"names": list(names)}).scalars())


def current_revision(engine: Engine) -> str | None:
    """The ledger's revision: an Alembic revision id, ``legacy:N`` or ``None`` (empty)."""
    with prepare_engine(engine).connect() as conn:
        return _revision(conn)


def migrate(engine: Engine, target: str = "head") -> Upgrade:
    """Bring the ledger on ``engine`` to ``target`` (default: the newest revision).

    Idempotent and safe from many processes at once (see the module docstring).

    :param engine: the ledger's engine.
    :param target: an Alembic revision id, or ``head``.
    :raises LedgerSchemaError: the database holds ledger tables without any version record, a
        hand-written version this code does not know, or rows a new constraint refuses.
    """
    prepare_engine(engine)
    wanted = head() if target == "head" else target
    found = current_revision(engine)
    if found == wanted:
        return Upgrade(found, found, created=False)
    if target == "head" and found is not None and _is_newer(found):
        # A newer deployment upgraded first (rolling deployment): revisions only ever add, so
        # this code keeps working on the newer schema and must not try to "upgrade" it.
        log.warning("ledger is at revision %s, newer than this code's %s; leaving it as it is", found, wanted)
        return Upgrade(found, found, created=False)
    from alembic import command

    with engine.begin() as conn:
        if not is_sqlite(conn):
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _ADVISORY_LOCK_ID})
        before = _revision(conn)  # again, under the lock: another starter may have done it
        config = _config(conn)
        if before is None:
            _create_fresh(conn, wanted)
            command.stamp(config, wanted)
            return Upgrade(None, wanted, created=True)
        if before.startswith("legacy:"):
            command.stamp(config, _adopt_legacy(int(before.split(":", 1)[1])))
        command.upgrade(config, wanted)
        after = _revision(conn)
        if after != wanted:  # Alembic treats an older target as "already there"
            raise LedgerSchemaError(f"the ledger is at {after}, past {wanted}: upgrades only go forward")
        return Upgrade(before, wanted, created=False)


def _create_fresh(conn: Connection, wanted: str) -> None:
    from onceflow.ledger.schema import metadata

    if wanted != head():
        raise LedgerSchemaError(f"an empty ledger is created at the newest revision {head()}, not {wanted}")
    present = set(sa.inspect(conn).get_table_names()) & set(metadata.tables)
    if present:
        raise LedgerSchemaError(
            f"the database has ledger tables {sorted(present)} but no version record "
            f"({VERSION_TABLE} or {LEGACY_VERSION_TABLE}); it was not made by onceflow's migrations, "
            "so they will not guess its shape"
        )
    metadata.create_all(conn)


def _is_newer(revision: str) -> bool:
    if revision.startswith("legacy:"):
        return False
    try:
        return script_directory().get_revision(revision) is None
    except Exception:
        return True


def _adopt_legacy(version: int) -> str:
    revision = f"ledger_v{version}"
    try:
        script_directory().get_revision(revision)
    except Exception:
        raise LedgerSchemaError(
            f"{LEGACY_VERSION_TABLE} says hand-written version {version}, which this code does not know"
        ) from None
    return revision
