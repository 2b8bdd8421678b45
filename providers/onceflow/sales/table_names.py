"""Sales table names: one validator for every place a name is configured, and one resolution.

:func:`validate_table_name` (no database) refuses, with a message that says why:

* anything but ``table`` or ``schema.table`` of plain identifiers (injection-shaped names);
* a **temporary** or system schema (``pg_temp``, ``pg_temp_3``, SQLite's ``temp``, ``pg_catalog``,
  ``information_schema``, ``pg_toast``): a table there vanishes with the session, so the load
  would succeed, ``load_audit`` would say the day is loaded, and the rows would be gone;
* the names of the tables every sales table shares (``rejects``, ``load_audit``, ``load_fence``),
  in any schema and any case;
* a table part longer than :data:`MAX_TABLE_LENGTH`: its index ``ix_<table>_partition_date``
  would pass PostgreSQL's 63-byte limit and be cut, colliding between tables.

:func:`resolve_table` (with the warehouse) then finds the **physical** table the name means, the
way the loads' own statements resolve it (the search path, a temporary table shadowing it, SQLite's
case-insensitive names), and returns the one name that fences it (:attr:`ResolvedTable.fence_name`)
and the schema-qualified name every statement uses, so ``daily_sales`` and ``public.daily_sales``
share one fence and one audit row and a session's search path cannot send a load elsewhere.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

# One or two dot-separated SQL identifiers (``schema.table``); no quotes, spaces or punctuation.
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE_RE = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})?$")
_TEMPORARY_SCHEMA = re.compile(
    r"^(pg_temp(_\d+)?|pg_toast(_temp_\d+)?|temp|pg_catalog|information_schema)$", re.I
)
#: tables every sales table of a warehouse shares (onceflow.sales.schema.warehouse_tables).
RESERVED_TABLES = frozenset({"rejects", "load_audit", "load_fence"})
#: ``ix_<table>_partition_date`` must fit PostgreSQL's 63-byte identifiers.
MAX_TABLE_LENGTH = 63 - len("ix__partition_date")
#: the schema whose tables keep their bare name as fence name (as before schemas were resolved).
DEFAULT_SCHEMA = {"postgresql": "public", "sqlite": "main"}


class InvalidNameError(ValueError):
    """A table or partition name is not a plain identifier or date, or would lose data."""


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a table name loads can keep (``table`` or ``schema.table``), else raise.

    :param name: the configured table name.
    :raises InvalidNameError: naming the rule the name breaks (see the module docstring).
    """
    if not isinstance(name, str) or not _TABLE_RE.fullmatch(name):
        raise InvalidNameError(
            f"refusing table name {name!r}: expected an identifier like 'daily_sales' or "
            "'analytics.daily_sales' (letters, digits, underscore; at most one dot)"
        )
    schema, _, table = name.rpartition(".")
    if schema and _TEMPORARY_SCHEMA.fullmatch(schema):
        raise InvalidNameError(
            f"refusing table name {name!r}: {schema!r} is a temporary or system schema; a table there "
            "disappears with the session (or is not yours), so loaded days would vanish while "
            "load_audit says they are loaded. Use a permanent schema such as 'analytics'."
        )
    if table.lower() in RESERVED_TABLES:
        raise InvalidNameError(
            f"refusing table name {name!r}: {table!r} is one of the tables every sales table shares "
            f"({', '.join(sorted(RESERVED_TABLES))}); choose another name"
        )
    if len(table) > MAX_TABLE_LENGTH:
        raise InvalidNameError(
            f"refusing table name {name!r}: the table part is {len(table)} characters, at most "
            f"{MAX_TABLE_LENGTH} fit (its index ix_<table>_partition_date must fit 63)"
        )
    return name


@dataclasses.dataclass(frozen=True)
class ResolvedTable:
    """The physical table a configured name means in one warehouse."""

    schema: str
    table: str
    #: the table's key in ``load_fence``, ``load_audit``, ``rejects`` and the ledger's work keys:
    #: the bare table name in the default schema (``public``, SQLite's ``main``), else ``schema.table``.
    fence_name: str
    #: the schema-qualified name statements use (``schema.table``; bare for SQLite's ``main``).
    statement_name: str


def resolve_table(engine: Engine, name: str) -> ResolvedTable:
    """Resolve ``name`` as the warehouse's statements would, refusing what would lose data.

    :raises InvalidNameError: the name is invalid, resolves to a temporary table, or names a schema
        the warehouse does not have.
    """
    validate_table_name(name)
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            schema, table = _resolve_postgres(conn, name)
        elif conn.dialect.name == "sqlite":
            schema, table = _resolve_sqlite(conn, name)
        else:
            raise InvalidNameError(f"partition loads support PostgreSQL and SQLite, not {conn.dialect.name}")
    default = DEFAULT_SCHEMA[engine.dialect.name]
    fence = table if schema == default else f"{schema}.{table}"
    statement = table if engine.dialect.name == "sqlite" and schema == default else f"{schema}.{table}"
    validate_table_name(statement)  # the resolved schema is checked like a configured one
    return ResolvedTable(schema, table, fence, statement)


def _resolve_postgres(conn: Connection, name: str) -> tuple[str, str]:
    import sqlalchemy as sa

    schema, _, table = name.rpartition(".")
    preparer = conn.dialect.identifier_preparer
    quoted = preparer.format_table(sa.table(table, schema=schema or None))
    found = conn.execute(
        sa.text(
            "SELECT n.nspname, c.relname, c.relpersistence = 't' FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:name)"
        ),
        {"name": quoted},
    ).one_or_none()
    if found is not None:
        nspname, relname, temporary = found
        if temporary:
            raise InvalidNameError(
                f"refusing table name {name!r}: it resolves to the temporary table {nspname}.{relname} "
                "of this session (shadowing any permanent one); its rows would vanish with the session"
            )
        return str(nspname), str(relname)
    # Not there yet: CREATE TABLE puts it in the named schema, else the search path's first one.
    target: str | None
    if schema:
        target = schema if preparer._requires_quotes(schema) else schema.lower()
    else:
        target = conn.execute(sa.text("SELECT current_schema()")).scalar_one_or_none()
    if target is None:
        raise InvalidNameError(
            f"refusing table name {name!r}: no schema of the warehouse's search path exists to create it in"
        )
    exists = conn.execute(
        sa.text("SELECT nspname FROM pg_namespace WHERE nspname = :s"), {"s": target}
    ).scalar_one_or_none()
    if exists is None:
        raise InvalidNameError(f"refusing table name {name!r}: the warehouse has no schema {target!r}")
    created = table if preparer._requires_quotes(table) else table.lower()
    return str(exists), created


def _resolve_sqlite(conn: Connection, name: str) -> tuple[str, str]:
    schema, _, table = name.rpartition(".")
    databases = {str(r[1]).lower(): str(r[1]) for r in conn.exec_driver_sql("PRAGMA database_list")}
    if schema and schema.lower() not in databases:
        raise InvalidNameError(
            f"refusing table name {name!r}: the warehouse has no database {schema!r} attached"
        )
    if not schema:
        shadow = conn.exec_driver_sql(
            "SELECT name FROM temp.sqlite_master WHERE type IN ('table', 'view') AND name = ? COLLATE NOCASE",
            (table,),
        ).first()
        if shadow is not None:
            raise InvalidNameError(
                f"refusing table name {name!r}: it resolves to the temporary table temp.{shadow[0]} of "
                "this connection; its rows would vanish with the connection"
            )
    db = databases[schema.lower()] if schema else "main"
    stored = conn.exec_driver_sql(
        f"SELECT name FROM \"{db}\".sqlite_master WHERE type IN ('table', 'view') AND name = ? COLLATE NOCASE",
        (table,),
    ).first()
    # SQLite's names are case-insensitive: the stored spelling names the table once.
    return db, str(stored[0]) if stored is not None else table
