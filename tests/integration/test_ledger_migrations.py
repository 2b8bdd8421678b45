"""Migrations: a v1 ledger database upgrades in place and keeps its data."""

from __future__ import annotations

import sqlalchemy as sa

from onceflow.ledger import Ledger, create_ledger_engine, migrations, schema


def test_a_v1_database_upgrades_to_the_latest_schema_and_keeps_its_rows(ledger_url, fake_clock):
    engine = create_ledger_engine(ledger_url)
    try:
        assert migrations.migrate(engine, target=1) == [1]
        assert migrations.current_version(engine) == 1
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO work_items (work_key, kind, state, priority, available_at, fencing_token,"
                    " attempts, max_attempts, created_at, updated_at)"
                    " VALUES ('old:1', 'fetch', 'pending', 0, 0, 0, 0, 5, 0, 0)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO results (work_key, step, processing_version, fencing_token, committed_at)"
                    " VALUES ('old:0', 'fetch', 'v1', 1, 0)"
                )
            )

        assert migrations.migrate(engine) == [2, 3]
        assert migrations.current_version(engine) == migrations.LATEST_VERSION
        assert migrations.migrate(engine) == []

        inspector = sa.inspect(engine)
        for table in schema.metadata.sorted_tables:
            actual = {c["name"] for c in inspector.get_columns(table.name)}
            assert actual == {c.name for c in table.columns}, table.name

        ledger = Ledger(engine, clock=fake_clock)
        old = ledger.item("old:1")
        assert old.lane == "new" and old.required_version is None
        lease = ledger.claim("fetch", "w", 30, "v1")
        assert lease.work_key == "old:1"
        ledger.commit_result(lease, "fetch", {"upgraded": True})
        assert ledger.item("old:1").state == "done"
        assert [r.follow_ups for r in ledger.results("old:0")] == [[]]
    finally:
        engine.dispose()


def test_migrating_an_empty_database_twice_is_a_no_op(ledger_url):
    engine = create_ledger_engine(ledger_url)
    try:
        assert migrations.migrate(engine) == [1, 2, 3]
        assert migrations.migrate(engine) == []
        with engine.connect() as conn:
            versions = list(
                conn.execute(sa.text("SELECT version FROM schema_version ORDER BY version")).scalars()
            )
        assert versions == [1, 2, 3]
    finally:
        engine.dispose()
