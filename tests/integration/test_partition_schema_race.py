"""Many load tasks creating the warehouse tables at once, as a backfill's first wave does.

On PostgreSQL, concurrent ``CREATE TABLE``s of one name fail with a unique violation in
``pg_type``; each creator must wait for the first instead (it did not once, and the first
four runs of a backfill failed their ``load``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
