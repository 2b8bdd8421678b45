"""In-place upgrade of an existing warehouse to the tables of :mod:`onceflow.sales.schema`.

There is one schema definition (``schema.py``); this module only compares it with what the
database has and adds the missing columns (every column added after the first release is nullable
or has a server default), then moves the data the new columns describe:

* ``load_fence.ledger_token``: before, ``load_fence`` held the ledger's tokens themselves, so the
  newest ledger token registered is ``max(fence_token, committed_token)``.
* ``load_audit.ledger_token``: an audit row whose token and run equal its partition's committed
  fence token and run was written by a ledger-fenced load, under that ledger token.
* the old ``load_lease`` table (warehouse-mode tokens, a second sequence that ``load_fence`` did
  not see) is folded into ``load_fence``: the partition's token becomes the newer of the two, so
  an attempt holding an old token of either table is refused afterwards. Then every
  ``load_lease`` token is moved on by one, so a warehouse-lease load of the previous release
  still running (its commit checks ``load_lease`` only) is refused at its commit. ``load_lease``
  itself is left in place, unused by this release.

Runs inside :meth:`PartitionStore.create_schema`'s transaction and lock; a second run finds
nothing missing and changes nothing. Attempts in flight during an upgrade are refused at commit and
retried, as after any newer attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from onceflow.sales.schema import WarehouseTables


def add_missing_columns(conn: Connection, table: sa.Table) -> list[str]:
    """``ALTER TABLE ... ADD COLUMN`` for every column of ``table`` the database lacks."""
    inspector = sa.inspect(conn)
    if not inspector.has_table(table.name, schema=table.schema):
        return []
    present = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
    ddl = conn.dialect.ddl_compiler(conn.dialect, None)  # type: ignore[arg-type]  # only get_column_specification is used
    quoted = conn.dialect.identifier_preparer.format_table(table)
    added = []
    for column in table.columns:
        if column.name in present:
            continue
        if not column.nullable and column.server_default is None:
            raise RuntimeError(f"cannot add NOT NULL column {table.name}.{column.name} without a default")
        conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD COLUMN {ddl.get_column_specification(column)}")
        added.append(column.name)
    return added


def upgrade(conn: Connection, tables: WarehouseTables) -> dict[str, list[str]]:
    """Bring an existing warehouse up to ``tables`` (run it before ``create_all``).

    :return: the columns added per table (a table created from scratch is not listed).
    """
    inspector = sa.inspect(conn)
    fence_existed = inspector.has_table(tables.fence.name)
    if conn.dialect.name == "postgresql" and inspector.has_table("load_lease"):
        fence_columns = (
            {c["name"] for c in inspector.get_columns(tables.fence.name)} if fence_existed else set()
        )
        if "ledger_token" not in fence_columns:
            # The fold below updates every load_lease row. Lock them before any ALTER: a load of
            # the previous release holding one then finishes first, instead of waiting for a
            # table this transaction ALTERed while this transaction waits for its row (deadlock).
            conn.exec_driver_sql("SELECT 1 FROM load_lease FOR UPDATE")
    added = {t.name: add_missing_columns(conn, t) for t in (tables.fence, tables.audit)}
    ft, at = tables.fence, tables.audit
    if "ledger_token" in added[ft.name]:
        conn.execute(
            ft.update().values(
                ledger_token=sa.case(
                    (ft.c.fence_token > ft.c.committed_token, ft.c.fence_token), else_=ft.c.committed_token
                ),
                fenced_by="ledger",
            )
        )
    if not fence_existed or "ledger_token" in added[ft.name]:
        if not fence_existed:
            ft.create(conn)
        _fold_load_lease(conn, ft)
    if "ledger_token" in added[at.name]:
        written_by_ledger = (
            sa.select(ft.c.fence_token)
            .where(
                ft.c.table_name == at.c.table_name,
                ft.c.partition_key == at.c.partition_key,
                ft.c.committed_token == at.c.fence_token,
                ft.c.run_id == at.c.run_id,
                ft.c.ledger_token > 0,
            )
            .exists()
        )
        conn.execute(at.update().where(written_by_ledger).values(ledger_token=at.c.fence_token))
    return {name: cols for name, cols in added.items() if cols}


def _fold_load_lease(conn: Connection, ft: sa.Table) -> None:
    if not sa.inspect(conn).has_table("load_lease"):
        return
    lease = sa.Table("load_lease", sa.MetaData(), autoload_with=conn)
    fences = {(r.table_name, r.partition_key): r for r in conn.execute(sa.select(ft)).all()}
    for row in conn.execute(sa.select(lease)).all():
        holder = {
            "fence_token": row.fence_token, "run_id": row.run_id, "try_number": row.try_number,
            "fenced_by": "warehouse", "expires_at_utc": row.expires_at_utc,
        }  # fmt: skip
        fence = fences.get((row.table_name, row.partition_key))
        if fence is None:
            conn.execute(
                ft.insert().values(
                    table_name=row.table_name, partition_key=row.partition_key, work_key="",
                    committed_token=0, ledger_token=0, updated_at_utc=row.expires_at_utc, **holder,
                )
            )  # fmt: skip
        elif int(row.fence_token) > max(int(fence.fence_token), int(fence.committed_token)):
            conn.execute(
                ft.update()
                .where(ft.c.table_name == row.table_name, ft.c.partition_key == row.partition_key)
                .values(**holder)
            )
    # A load of the previous release still running checks only load_lease at its commit: move
    # every token on, so that check refuses it (its retry fences through load_fence).
    conn.execute(lease.update().values(fence_token=lease.c.fence_token + 1))
