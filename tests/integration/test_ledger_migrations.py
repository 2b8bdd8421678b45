"""Alembic migrations: ledgers made by the released hand-written migrations upgrade in place and
end up exactly like a new ledger; the database itself refuses states outside the model and a
fencing token going down; concurrent starters (real processes) upgrade once.

``legacy_ledger_migrations`` is a verbatim copy of the hand-written ``migrations.py`` that
shipped before Alembic, so the old ledgers here are built by the old code itself.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import legacy_ledger_migrations as handwritten
import pytest
import sqlalchemy as sa

from onceflow.ledger import Ledger, create_ledger_engine, migrations
from onceflow.ledger.errors import LedgerSchemaError

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.engine import Engine

RACERS = 6


def _shape(engine: Engine) -> dict[str, Any]:
    """Everything about the schema a migration could get wrong, comparable across two databases."""
    inspector = sa.inspect(engine)
    shape: dict[str, Any] = {}
    # schema_version: the hand-written release's marker, kept in upgraded ledgers only.
    for table in sorted(set(inspector.get_table_names()) - {"schema_version"}):
        shape[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                for c in inspector.get_columns(table)
            ],
            "pk": inspector.get_pk_constraint(table)["constrained_columns"],
            "indexes": sorted(
                (
                    i["name"],
                    tuple(map(str, i.get("column_names") or ())),
                    tuple(map(str, i.get("expressions") or ())),
                    sorted((k, tuple(v)) for k, v in (i.get("column_sorting") or {}).items()),
                    i["unique"],
                    sorted((k, str(v)) for k, v in (i.get("dialect_options") or {}).items()),
                )
                for i in inspector.get_indexes(table)
            ),
            "unique": sorted(tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)),
            "checks": sorted((c["name"], c["sqltext"]) for c in inspector.get_check_constraints(table)),
        }
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            triggers = conn.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
            ).all()
        else:
            triggers = conn.exec_driver_sql(
                "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal ORDER BY tgname"
            ).all()
    shape["triggers"] = [tuple(t) for t in triggers]
    return shape


def _fresh_shape(url: str, suffix: str) -> dict[str, Any]:
    """The shape of a new ledger made from schema.py, in a sibling database of ``url``."""
    if url.startswith("sqlite"):
        other = url.replace(".db", f"-{suffix}.db")
    else:
        admin = create_ledger_engine(url, isolation_level="AUTOCOMMIT")
        name = f"{sa.engine.make_url(url).database}_{suffix}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        admin.dispose()
        other = sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)
    engine = create_ledger_engine(other)
    try:
        assert migrations.migrate(engine).created
        return _shape(engine)
    finally:
        engine.dispose()
        if not url.startswith("sqlite"):
            admin = create_ledger_engine(url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
            admin.dispose()


def _insert_item(conn: sa.Connection, key: str, state: str = "pending", token: int = 0) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO work_items (work_key, kind, state, priority, available_at, fencing_token,"
            " attempts, max_attempts, created_at, updated_at)"
            " VALUES (:key, 'fetch', :state, 0, 0, :token, 0, 5, 0, 0)"
        ),
        {"key": key, "state": state, "token": token},
    )


def _assert_refused(engine: Engine, statement: str) -> str:
    with pytest.raises(sa.exc.IntegrityError) as refused, engine.begin() as conn:
        conn.exec_driver_sql(statement)
    return str(refused.value)


@pytest.mark.parametrize("old_version", [1, 2, 3])
def test_a_handwritten_ledger_upgrades_in_place_to_exactly_the_new_schema(
    ledger_url, fake_clock, old_version
):
    engine = create_ledger_engine(ledger_url)
    try:
        assert handwritten.migrate(engine, target=old_version) == list(range(1, old_version + 1))
        with engine.begin() as conn:
            _insert_item(conn, "old:1")
            _insert_item(conn, "old:done", state="done", token=4)
            conn.execute(
                sa.text(
                    "INSERT INTO results (work_key, step, processing_version, fencing_token, committed_at)"
                    " VALUES ('old:done', 'fetch', 'v1', 4, 0)"
                )
            )
        assert migrations.current_revision(engine) == f"legacy:{old_version}"

        done = migrations.migrate(engine)

        assert (done.before, done.after, done.created) == (f"legacy:{old_version}", migrations.head(), False)
        assert migrations.current_revision(engine) == migrations.head()
        assert not migrations.migrate(engine).changed
        assert _shape(engine) == _fresh_shape(ledger_url, "fresh")
        # Workers of the hand-written release, still running in a rolling deployment, start
        # and find nothing to do (instead of re-running their migrations over the new schema).
        assert handwritten.migrate(engine) == []

        # The old rows still work, and the database now enforces the state model on them.
        ledger = Ledger(engine, clock=fake_clock)
        assert ledger.item("old:1").lane == "new"
        lease = ledger.claim("fetch", "w", 30, "v1")
        assert lease is not None and lease.work_key == "old:1"
        ledger.commit_result(lease, "fetch", {"upgraded": True})
        assert ledger.item("old:1").state == "done"
        assert [r.follow_ups for r in ledger.results("old:done")] == [[]]
        _assert_refused(engine, "UPDATE work_items SET state = 'bogus' WHERE work_key = 'old:done'")
        assert "fencing token may not go down" in _assert_refused(
            engine, "UPDATE work_items SET fencing_token = 3 WHERE work_key = 'old:done'"
        )
    finally:
        engine.dispose()


def test_the_database_refuses_a_state_outside_the_model(ledger):
    ledger.add("fetch", "a:1")
    assert "ck_work_items_state" in _assert_refused(ledger.engine, "UPDATE work_items SET state = 'bogus'")
    with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as conn:
        _insert_item(conn, "a:2", state="Done")
    assert "ck_transitions_to_state" in _assert_refused(
        ledger.engine,
        "INSERT INTO transitions (work_key, event, from_state, to_state, actor, at)"
        " VALUES ('a:1', 'claim', 'pending', 'bogus', 'worker', 0)",
    )
    assert ledger.item("a:1").state == "pending"


def test_the_database_refuses_a_fencing_token_going_down(ledger):
    ledger.add("fetch", "a:1")
    for _ in range(3):
        lease = ledger.claim("fetch", "w", 30, "v1")
        assert lease is not None
        lease.release("again")
    assert ledger.item("a:1").fencing_token == 3
    assert "fencing token may not go down" in _assert_refused(
        ledger.engine, "UPDATE work_items SET fencing_token = 2 WHERE work_key = 'a:1'"
    )
    _assert_refused(ledger.engine, "UPDATE work_items SET state = 'bogus', fencing_token = -3")
    with (
        pytest.raises(sa.exc.IntegrityError, match="ck_work_items_fencing_token"),
        ledger.engine.begin() as conn,
    ):
        _insert_item(conn, "a:2", token=-1)
    with ledger.engine.begin() as conn:  # going up by one into a new lease, or staying, is what claims do
        conn.exec_driver_sql(
            "UPDATE work_items SET state = 'leased', lease_owner = 'w', lease_expires_at = 1e12,"
            " fencing_token = fencing_token + 1, attempts = 1"
        )
        conn.exec_driver_sql("UPDATE work_items SET reason = 'same token'")
    assert ledger.item("a:1").fencing_token == 4


def test_rows_that_break_a_new_constraint_stop_the_upgrade_and_name_their_keys(ledger_url):
    engine = create_ledger_engine(ledger_url)
    try:
        handwritten.migrate(engine)
        with engine.begin() as conn:
            _insert_item(conn, "ok:1")
            _insert_item(conn, "broken:1", state="bogus")
        with pytest.raises(LedgerSchemaError, match=r"ck_work_items_state.*broken:1"):
            migrations.migrate(engine)
        # Nothing changed: one transaction for the whole upgrade.
        assert migrations.current_revision(engine) == "legacy:3"
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE work_items SET state = 'cancelled' WHERE work_key = 'broken:1'")
        assert migrations.migrate(engine).after == migrations.head()
    finally:
        engine.dispose()


def test_a_database_with_ledger_tables_but_no_version_is_not_guessed_at(ledger_url):
    engine = create_ledger_engine(ledger_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE work_items (id INTEGER PRIMARY KEY)")
        with pytest.raises(LedgerSchemaError, match="no version record"):
            migrations.migrate(engine)
    finally:
        engine.dispose()


def test_a_version_table_without_a_row_falls_back_to_the_handwritten_record_and_two_rows_are_refused(
    ledger_url,
):
    """The revision is read with one query (``_revision``): an empty Alembic table is no revision,
    so the hand-written ``schema_version`` decides; two rows are Alembic's "several heads" error."""
    engine = create_ledger_engine(ledger_url)
    try:
        handwritten.migrate(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE {migrations.VERSION_TABLE} (version_num VARCHAR(32) NOT NULL)"
            )
        assert migrations.current_revision(engine) == "legacy:3"
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {migrations.VERSION_TABLE} (version_num) VALUES ('ledger_v6'), ('ledger_v7')"
            )
        with pytest.raises(Exception, match="more than one head"):
            migrations.current_revision(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_two_ledgers_in_two_schemas_of_one_database_each_find_their_own_version(postgres_url):
    """The version table is looked up as the ledger's own statements find it (its search path),
    not by name anywhere in the database: a second ledger in another schema is created, not read
    as the first one's revision."""
    with sa.create_engine(postgres_url).begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA ledger_a; CREATE SCHEMA ledger_b")
    first = create_ledger_engine(f"{postgres_url}?options=-csearch_path%3Dledger_a")
    second = create_ledger_engine(f"{postgres_url}?options=-csearch_path%3Dledger_b")
    try:
        assert migrations.migrate(first).created
        assert migrations.current_revision(second) is None
        done = migrations.migrate(second)
        assert done.created and done.after == migrations.head()
        with second.connect() as conn:
            schemas = (
                conn.exec_driver_sql(
                    "SELECT table_schema FROM information_schema.tables "
                    f"WHERE table_name = '{migrations.VERSION_TABLE}' ORDER BY 1"
                )
                .scalars()
                .all()
            )
        assert schemas == ["ledger_a", "ledger_b"]
    finally:
        first.dispose()
        second.dispose()


def test_a_ledger_a_newer_release_upgraded_is_left_alone(ledger_url, fake_clock, caplog):
    """Rolling deployment: new workers upgraded first, old ones still start and keep working."""
    engine = create_ledger_engine(ledger_url)
    try:
        migrations.migrate(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE {migrations.VERSION_TABLE} SET version_num = 'ledger_v99_from_the_future'"
            )
        done = migrations.migrate(engine)
        assert (done.before, done.after, done.changed) == ("ledger_v99_from_the_future",) * 2 + (False,)
        assert "newer than this code's" in caplog.text
        ledger = Ledger(engine, clock=fake_clock)
        ledger.add("fetch", "a:1")
        assert ledger.claim("fetch", "w", 30, "v1") is not None
    finally:
        engine.dispose()


def _race(url: str, barrier: Any, results: Any) -> None:
    engine = create_ledger_engine(url)
    try:
        barrier.wait(timeout=120)
        done = migrations.migrate(engine)
        results.put((os.getpid(), done.before, done.after, done.created))
    except BaseException as exc:
        results.put((os.getpid(), "error", repr(exc), False))
        raise
    finally:
        engine.dispose()


@pytest.mark.parametrize("start", ["empty", "handwritten_v1"])
def test_concurrent_starters_in_real_processes_upgrade_exactly_once(ledger_url, start):
    engine = create_ledger_engine(ledger_url)
    try:
        if start == "handwritten_v1":
            handwritten.migrate(engine, target=1)
            with engine.begin() as conn:
                _insert_item(conn, "old:1")
        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(RACERS), ctx.Queue()
        racers = [ctx.Process(target=_race, args=(ledger_url, barrier, results)) for _ in range(RACERS)]
        for racer in racers:
            racer.start()
        outcomes = [results.get(timeout=300) for _ in racers]
        for racer in racers:
            racer.join(timeout=60)
        assert [r.exitcode for r in racers] == [0] * RACERS, outcomes
        head = migrations.head()
        assert {after for _, _, after, _ in outcomes} == {head}
        # Exactly one racer did the work; everyone else found it done.
        did_it = [o for o in outcomes if o[3] or o[1] != head]
        assert len(did_it) == 1, outcomes
        assert did_it[0][1] == (None if start == "empty" else "legacy:1")
        with engine.connect() as conn:
            versions = (
                conn.exec_driver_sql(f"SELECT version_num FROM {migrations.VERSION_TABLE}").scalars().all()
            )
        assert versions == [head]
        assert _shape(engine) == _fresh_shape(ledger_url, "race")
        if start == "handwritten_v1":
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT state FROM work_items").scalars().all() == ["pending"]
    finally:
        engine.dispose()


def test_onceflow_ledger_upgrade_runs_the_migrations_of_the_named_connection(tmp_path: Path, airflow_env):
    path = tmp_path / "ledger.db"
    engine = create_ledger_engine(f"sqlite:///{path}")
    handwritten.migrate(engine, target=3)
    engine.dispose()
    env = {
        **airflow_env.variables,
        "AIRFLOW_CONN_MY_LEDGER": f'{{"conn_type": "sqlite", "host": "{path}"}}',
    }
    onceflow = [sys.executable, "-m", "onceflow.cli", "ledger"]

    def run(*args: str) -> str:
        done = subprocess.run([*onceflow, *args], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "ledger: legacy:3" in run("current", "--conn-id", "my_ledger")
    # Airflow's own log lines (the connection lookup, Alembic's progress) come first.
    assert run("upgrade", "--conn-id", "my_ledger").splitlines()[-1] == (
        f"upgraded the ledger from legacy:3 to {migrations.head()}"
    )
    assert "nothing to do" in run("upgrade", "--url", f"sqlite:///{path}")
    backwards = subprocess.run(
        [*onceflow, "upgrade", "--url", f"sqlite:///{path}", "--to", "ledger_v2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert backwards.returncode == 1
    assert (
        f"the ledger is at {migrations.head()}, past ledger_v2: upgrades only go forward" in backwards.stderr
    )
    engine = create_ledger_engine(f"sqlite:///{path}")
    try:
        assert migrations.current_revision(engine) == migrations.head()
    finally:
        engine.dispose()


def test_ledger_v4_creates_the_checks_it_was_released_with_whatever_schema_says_now(ledger_url, monkeypatch):
    """A later release changes a check in schema.py (here: a new state) and adds a revision that
    changes the constraint. ledger_v4 must still add the constraint it added when released, or
    upgrading an old ledger gives a different database than upgrading it back then."""
    from onceflow.ledger import schema

    changed = dict(schema.CHECKS)
    changed["ck_work_items_state"] = ("work_items", "state IN ('archived', 'done', 'pending')")
    monkeypatch.setattr(schema, "CHECKS", changed)
    engine = create_ledger_engine(ledger_url)
    try:
        handwritten.migrate(engine, target=3)
        assert migrations.migrate(engine, target="ledger_v4").after == "ledger_v4"
        with engine.begin() as conn:
            _insert_item(conn, "leased:1", state="leased")  # a state of the released model
        assert "ck_work_items_state" in _assert_refused(
            engine,
            "INSERT INTO work_items (work_key, kind, state, priority, available_at, fencing_token,"
            " attempts, max_attempts, created_at, updated_at)"
            " VALUES ('archived:1', 'fetch', 'archived', 0, 0, 0, 0, 5, 0, 0)",
        )
    finally:
        engine.dispose()


def test_ledger_v7_indexes_a_v6_ledger_with_data_and_goes_back(ledger_url, monkeypatch):
    """ledger_v7 on a ledger at ledger_v6 holding live and finished items: it adds exactly the
    leased-items index, the rows and the view's answers stay the same, a second run does nothing,
    its downgrade gives back the ledger_v6 schema, and upgrading to the newest revision from there
    ends exactly like a new ledger."""
    from alembic import command

    from onceflow.opsview import questions
    from onceflow.testing import ops_view_state

    engine = create_ledger_engine(ledger_url)
    now = 1_764_000_000.0
    try:
        handwritten.migrate(engine, target=3)
        assert migrations.migrate(engine, target="ledger_v6").after == "ledger_v6"
        v6 = _shape(engine)
        monkeypatch.setattr(ops_view_state, "create_ledger", lambda engine: None)  # stay at ledger_v6
        ops_view_state.seed_ledger(engine, now)  # pending, leased, done and failed items; NULL versions

        def state() -> tuple[Any, ...]:
            with engine.connect() as conn:
                rows = conn.exec_driver_sql("SELECT * FROM work_items ORDER BY id").all()
                return rows, questions.all_questions(conn, now)

        before = state()
        assert before[1]["active_versions"]["versions"]  # (the seed has live items to count)
        done = migrations.migrate(engine, target="ledger_v7")
        assert (done.before, done.after, done.created) == ("ledger_v6", "ledger_v7", False)
        v7 = _shape(engine)
        indexes = {i[0]: i for i in v7["work_items"]["indexes"]}
        assert indexes.pop("ix_work_items_leased")[1:4] == (("kind", "required_version"), (), [])
        assert list(indexes.values()) == v6["work_items"]["indexes"]  # nothing else changed
        assert {**v7, "work_items": None} == {**v6, "work_items": None}
        assert {**v7["work_items"], "indexes": None} == {**v6["work_items"], "indexes": None}
        with engine.connect() as conn:  # partial: the leased items only
            if engine.dialect.name == "sqlite":
                ddl = "SELECT sql FROM sqlite_master WHERE name = 'ix_work_items_leased'"
            else:
                ddl = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_work_items_leased'"
            assert "WHERE" in conn.exec_driver_sql(ddl).scalar_one()
            assert "'leased'" in conn.exec_driver_sql(ddl).scalar_one()
        assert state() == before
        assert not migrations.migrate(engine, target="ledger_v7").changed

        with engine.begin() as conn:  # the downgrade, as `alembic downgrade ledger_v6` runs it
            command.downgrade(migrations._config(conn), "ledger_v6")
        assert migrations.current_revision(engine) == "ledger_v6"
        assert _shape(engine) == v6
        assert state() == before

        assert migrations.migrate(engine).after == migrations.head()
        assert _shape(engine) == _fresh_shape(ledger_url, "fresh")
        assert state() == before
    finally:
        engine.dispose()


def test_head_is_alembics_head_of_the_versions_folder():
    # HEAD lets a current ledger open without Alembic; a new revision must move it too.
    assert migrations.script_directory().get_current_head() == migrations.HEAD


def test_a_current_ledger_opens_without_importing_alembic_and_an_old_one_is_upgraded(ledger_url):
    # Alembic costs about 70 ms of CPU in every task process that builds a Ledger: only an
    # upgrade may import it. A fresh interpreter, as a task process is.
    code = (
        "import sys\n"
        "from onceflow.ledger import Ledger, create_ledger_engine, migrations\n"
        "engine = create_ledger_engine(sys.argv[1])\n"
        "Ledger(engine)\n"
        "print(migrations.current_revision(engine), 'alembic' in sys.modules)\n"
    )

    def open_ledger() -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, ledger_url], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    engine = create_ledger_engine(ledger_url)
    try:
        handwritten.migrate(engine, target=3)
    finally:
        engine.dispose()
    assert open_ledger() == f"{migrations.HEAD} True"  # upgraded from legacy:3: Alembic did it
    assert open_ledger() == f"{migrations.HEAD} False"  # current: no Alembic
