"""Many load tasks creating the warehouse tables at once, as a backfill's first wave does.

On PostgreSQL, concurrent ``CREATE TABLE``s of one name fail with a unique violation in
``pg_type``; each creator must wait for the first instead (it did not once, and the first
four runs of a backfill failed their ``load``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import sqlalchemy as sa

from onceflow.sales.engine import make_engine

CREATORS = 6
# Two sales tables in one warehouse: they share the rejects, audit, lease and fence tables.
TABLES = ("daily_sales", "daily_sales_eu")

CREATOR = textwrap.dedent(
    """
    import sys
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore

    engine = make_engine(sys.argv[1])
    with engine.connect():  # connected before the start, so the race is in the DDL alone
        pass
    store = PartitionStore(engine, sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()  # the start: every creator is ready
    store.create_schema()
    print("created", flush=True)
    """
)


def test_concurrent_create_schema_all_succeed(sales_db_url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CREATOR, sales_db_url, TABLES[i % len(TABLES)]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(CREATORS)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.communicate()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outcomes = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    failures = [err for code, _, err in outcomes if code != 0]
    assert not failures, failures[0]
    assert all(out.strip() == "created" for _, out, _ in outcomes)
    tables = set(sa.inspect(make_engine(sales_db_url)).get_table_names())
    assert {*TABLES, "rejects", "load_audit", "load_fence"} <= tables, tables


@pytest.mark.postgres
def test_a_current_schema_takes_no_warehouse_lock_and_a_missing_column_still_upgrades(
    postgres_url: str,
) -> None:
    """Every load calls ``create_schema``: when nothing is missing it must not queue behind the
    warehouse-wide advisory lock (a backfill's loads would then run one at a time); when a column
    is missing it must still wait for the lock and add it."""
    from onceflow.sales.partition_store import _SCHEMA_LOCK, PartitionStore

    engine = make_engine(postgres_url)
    store = PartitionStore(engine, "daily_sales")
    store.create_schema()
    assert store.schema_is_current()
    holder = engine.connect()
    try:
        txn = holder.begin()
        holder.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": _SCHEMA_LOCK})

        def create_schema_in_background() -> threading.Event:
            done = threading.Event()
            threading.Thread(target=lambda: (store.create_schema(), done.set()), daemon=True).start()
            return done

        done = create_schema_in_background()
        assert done.wait(10), "create_schema on a current schema waited for the schema lock"

        # an older warehouse: a column of load_audit is missing -> the upgrade path, under the lock
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE load_audit DROP COLUMN source_watermark_utc")
        assert not store.schema_is_current()
        done = create_schema_in_background()
        assert not done.wait(2), "create_schema of an incomplete schema did not wait for the lock"
        txn.commit()  # let it through
        assert done.wait(30)
    finally:
        holder.close()
    columns = {c["name"] for c in sa.inspect(engine).get_columns("load_audit")}
    assert "source_watermark_utc" in columns
    assert store.schema_is_current()
    engine.dispose()


@pytest.mark.postgres
def test_schema_is_current_looks_at_the_store_s_own_schema(postgres_url: str) -> None:
    """Names resolve as the loads resolve them: a complete ``daily_sales`` in another schema does not
    make a missing one current, a schema-qualified or search-path name does, quoting is kept, and an
    object that only shares a table's name (a composite type) is no table."""
    from onceflow.sales.partition_store import PartitionStore

    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA other")
    PartitionStore(engine, "other.daily_sales").create_schema()  # and the shared tables, in public
    assert PartitionStore(engine, "other.daily_sales").schema_is_current()
    assert not PartitionStore(engine, "daily_sales").schema_is_current()
    PartitionStore(engine, "daily_sales").create_schema()
    assert PartitionStore(engine, "daily_sales").schema_is_current()
    assert sa.inspect(engine).has_table("daily_sales")
    # the same table named with its schema, and after a "$user" schema appears first on the
    # search path (current_schema() moves; unqualified names still resolve to public)
    assert PartitionStore(engine, "public.daily_sales").schema_is_current()
    with engine.begin() as conn:
        user = conn.exec_driver_sql("SELECT current_user").scalar()
        conn.exec_driver_sql(f'CREATE SCHEMA "{user}"')
    engine.dispose()
    assert PartitionStore(engine, "daily_sales").schema_is_current()
    # quoting: "Other"."DailySales" is not other.dailysales (an unquoted name would fold to it);
    # the resolver refuses it outright, since the warehouse has no schema "Other"
    PartitionStore(engine, "other.dailysales").create_schema()
    from onceflow.sales.table_names import InvalidNameError

    with pytest.raises(InvalidNameError, match="no schema 'Other'"):
        PartitionStore(engine, "Other.DailySales")
    # a composite type with the table's name and every one of its columns is no table
    weekly = PartitionStore(engine, "other.weekly_sales")
    fields = ", ".join(f'"{c.name}" text' for c in weekly.table.columns)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TYPE other.weekly_sales AS ({fields})")
    assert not weekly.schema_is_current()
    engine.dispose()
