"""The ``onceflow`` pytest plugin (entry point ``pytest11``): test Airflow DAGs against real Airflow.

Enable the Airflow part in your ``pyproject.toml`` (it changes ``AIRFLOW_HOME`` for the test
session, so it is opt-in)::

    [tool.pytest.ini_options]
    onceflow_isolated_airflow = true
    onceflow_dags_folder = "dags"        # relative to the rootdir

Fixtures (see ``docs/testing.md``):

* ``onceflow_airflow_env`` / ``onceflow_airflow_db``: the session's own AIRFLOW_HOME and migrated metadata DB.
* ``onceflow_run_dag``: run a DAG in-process with ``dag.test()`` and get states and XComs back.
* ``onceflow_airflow_cluster`` / ``onceflow_airflow_cluster_factory``: real api-server, scheduler, dag-processor
  and triggerer processes; nothing is left running after the test, pass or fail.
* ``onceflow_postgres_url`` / ``onceflow_postgres_url_factory``: throwaway PostgreSQL databases.
* ``onceflow_sheets_emulator``, ``onceflow_article_site``, ``onceflow_fake_gcs`` and the ledger
  and sales fixtures, served by ``sheets_fixtures``, ``article_fixtures``, ``gcs_fixtures``,
  ``ledger_fixtures`` and ``sales_fixtures`` in this package.
* ``onceflow_network_refusals``: the network guard's refusal log (take what a test provoked).

The network guard (``onceflow_network_guard = true``, opt-in) refuses every connection and name
lookup beyond loopback in pytest and in every Python process the tests start, and fails the test
during which one was attempted (:mod:`onceflow.testing.network_guard`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# pytest loads this module, by the pytest11 entry point, in every session of any project where
# onceflow is installed (benchmarks/bench_pytest_plugin_import.py measures what it adds to such a
# project's session). So it is the only module the plugin registers, every fixture is declared
# here and imports what serves it when a test uses it, and it imports nothing of onceflow (nor
# SQLAlchemy, Airflow or the emulators) until a session enables a feature or a test uses a
# fixture. Not ``pytest_plugins = [...]`` for the fixture modules: pytest looks each name of that
# list up among every installed distribution's entry points first (it reads each one's
# entry_points.txt, ~5 ms a name with 330 distributions), and five such scans plus the assertion
# rewriting of five more modules were most of what the plugin cost a foreign session.
if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.sales.generator import OrderRow
    from onceflow.testing.airflow_cluster import AirflowCluster
    from onceflow.testing.airflow_env import AirflowTestEnv
    from onceflow.testing.article_site import ArticleSite
    from onceflow.testing.clock import FakeClock
    from onceflow.testing.dag_runner import DagRunResult
    from onceflow.testing.gcs_fixtures import FakeGcs
    from onceflow.testing.network_guard import Refusal, RefusalLog
    from onceflow.testing.sheets_fixtures import SheetsEmulator

ENV_KEY = pytest.StashKey["AirflowTestEnv"]()
#: ``network_guard.ENV_ENABLED``, spelt here so a session without the guard never imports it
#: (tests/unit/test_pytest_plugin_import.py checks they agree).
GUARD_ENV_ENABLED = "ONCEFLOW_NETWORK_GUARD"
GUARD_KEY = pytest.StashKey["RefusalLog"]()
GUARD_SEEN_KEY = pytest.StashKey[list["Refusal"]]()
GUARD_OWNED_LOG_KEY = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "onceflow_isolated_airflow",
        "give the session its own AIRFLOW_HOME and metadata DB (set before Airflow is imported)",
        type="bool",
        default=False,
    )
    parser.addini("onceflow_dags_folder", "DAG folder for the session, relative to rootdir", default="dags")
    parser.addini("onceflow_plugins_folder", "plugins folder, relative to rootdir", default="plugins")
    parser.addini(
        "onceflow_network_guard",
        "refuse every connection and name lookup beyond loopback, in pytest and its child processes",
        type="bool",
        default=False,
    )
    group = parser.getgroup("onceflow")
    group.addoption(
        "--onceflow-isolated-airflow",
        action="store_true",
        default=False,
        help="same as the ini option onceflow_isolated_airflow = true",
    )
    group.addoption(
        "--onceflow-network-guard",
        action="store_true",
        default=False,
        help="same as the ini option onceflow_network_guard = true",
    )


def _configure_network_guard(config: pytest.Config) -> None:
    """Install the guard here and export it to every child; a session started by a guarded one
    (``ONCEFLOW_NETWORK_GUARD=1`` inherited) is guarded too and logs to the same file."""
    enabled = (
        config.getini("onceflow_network_guard")
        or config.getoption("onceflow_network_guard")
        or os.environ.get(GUARD_ENV_ENABLED) == "1"
    )
    if not enabled:
        return
    from onceflow.testing import network_guard as guard

    log_path = os.environ.get(guard.ENV_LOG)
    if not log_path:
        fd, log_path = tempfile.mkstemp(prefix="onceflow-network-guard-", suffix=".jsonl")
        os.close(fd)
        config.stash[GUARD_OWNED_LOG_KEY] = Path(log_path)
    os.environ.update(guard.child_environment(log_path))
    guard.install()
    log = guard.RefusalLog(Path(log_path))
    log.new()  # lines an outer session logged before this one started are its own
    config.stash[GUARD_KEY] = log
    config.stash[GUARD_SEEN_KEY] = []


def pytest_configure(config: pytest.Config) -> None:
    _configure_network_guard(config)
    enabled = config.getini("onceflow_isolated_airflow") or config.getoption("onceflow_isolated_airflow")
    if not enabled:
        return
    from onceflow.testing import postgres
    from onceflow.testing.airflow_env import prepare

    if "airflow" in sys.modules:
        raise pytest.UsageError(
            "onceflow: airflow was imported before the test session configured AIRFLOW_HOME; "
            "do not import airflow at module level in conftest.py or in a fixture module"
        )
    root = Path(str(config.rootpath))
    dags = (root / config.getini("onceflow_dags_folder")).resolve()
    plugins = (root / config.getini("onceflow_plugins_folder")).resolve()
    try:
        env = prepare(dags_folder=dags, plugins_folder=plugins)
    except postgres.PostgresUnavailable as exc:
        raise pytest.UsageError(
            f"onceflow: {postgres.ENV_VAR} is set but PostgreSQL is unreachable: {exc}"
        ) from exc
    env.apply()
    config.stash[ENV_KEY] = env


def pytest_unconfigure(config: pytest.Config) -> None:
    env = config.stash.get(ENV_KEY, None)
    # set ONCEFLOW_KEEP_AIRFLOW_HOME to keep the session's Airflow home for a look after the run
    if env is not None and not os.environ.get("ONCEFLOW_KEEP_AIRFLOW_HOME"):
        env.cleanup()
    owned = config.stash.get(GUARD_OWNED_LOG_KEY, None)
    if owned is not None:
        owned.unlink(missing_ok=True)


def _refusals_text(refusals: list[Refusal]) -> str:
    return "\n".join(f"- {r.message} [{r.event}, argv {r.argv}]" for r in refusals)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Fail the phase during which any process of the session attempted traffic beyond loopback,
    even when the code that met the refusal swallowed it."""
    outcome = yield
    log = item.config.stash.get(GUARD_KEY, None)
    if log is None:
        return
    refusals = log.new()
    if not refusals:
        return
    item.config.stash[GUARD_SEEN_KEY].extend(refusals)
    report = outcome.get_result()  # type: ignore[attr-defined]
    report.outcome = "failed"
    if hasattr(report, "wasxfail"):  # an xfail test would otherwise count this failure as expected
        del report.wasxfail
    report.longrepr = (
        f"onceflow network guard refused {len(refusals)} attempt(s):\n{_refusals_text(refusals)}"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    log = session.config.stash.get(GUARD_KEY, None)
    if log is None:
        return
    session.config.stash[GUARD_SEEN_KEY].extend(log.new())  # from a process still running
    if session.config.stash[GUARD_SEEN_KEY] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    seen = config.stash.get(GUARD_SEEN_KEY, None)
    if seen:
        terminalreporter.section("onceflow network guard", sep="=", red=True)
        terminalreporter.line(_refusals_text(seen))


def pytest_report_header(config: pytest.Config) -> str | None:
    env = config.stash.get(ENV_KEY, None)
    if env is None:
        return None
    db = "postgresql" if env.is_postgres else "sqlite"
    return f"onceflow: AIRFLOW_HOME={env.home} metadata={db} dags={env.dags_folder}"


@pytest.fixture
def onceflow_network_refusals(pytestconfig: pytest.Config) -> RefusalLog:
    """The network guard's refusal log: ``take(match, wait=...)`` consumes the refusals a test
    provoked on purpose, so they do not fail it."""
    log = pytestconfig.stash.get(GUARD_KEY, None)
    if log is None:
        pytest.fail(
            "onceflow: set `onceflow_network_guard = true` in the pytest configuration", pytrace=False
        )
    return log


# -- Airflow --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def onceflow_airflow_env(pytestconfig: pytest.Config) -> AirflowTestEnv:
    """The session's isolated Airflow installation (home folder, DB URL, environment)."""
    env = pytestconfig.stash.get(ENV_KEY, None)
    if env is None:
        pytest.fail(
            "onceflow: set `onceflow_isolated_airflow = true` in the pytest configuration", pytrace=False
        )
    return env


@pytest.fixture(scope="session")
def onceflow_airflow_db(onceflow_airflow_env: AirflowTestEnv) -> AirflowTestEnv:
    """The session's metadata DB, migrated (once) with ``airflow db migrate``."""
    onceflow_airflow_env.migrate()
    return onceflow_airflow_env


@pytest.fixture
def onceflow_run_dag(onceflow_airflow_db: AirflowTestEnv) -> Callable[..., DagRunResult]:
    """``run_dag(dag_or_id, logical_date=None, conf=None)``: one ``dag.test()`` run, read back."""
    from onceflow.testing.dag_runner import load_dag
    from onceflow.testing.dag_runner import run_dag as _run

    def runner(dag: Any, **kwargs: Any) -> DagRunResult:
        if isinstance(dag, str):
            dag = load_dag(dag)
        return _run(dag, **kwargs)

    return runner


@pytest.fixture
def onceflow_airflow_cluster_factory(
    onceflow_airflow_db: AirflowTestEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., AirflowCluster]]:
    """``factory(dags_folder=None, env=None, pools=None, parallelism=8)`` -> a started cluster.

    ``executor="celery"`` starts a :class:`~onceflow.testing.celery_cluster.CeleryCluster`
    instead (two schedulers, two Celery workers on Redis; ``celery=`` passes its options, e.g.
    ``{"workers": 2, "worker_concurrency": 4}``); it needs the session's metadata DB on
    PostgreSQL, and skips (fails in CI) on SQLite.

    Every cluster made here is stopped at teardown, and the test errors if any of its processes
    survived.
    """
    from onceflow.testing.airflow_cluster import cluster_factory

    yield from cluster_factory(onceflow_airflow_db, tmp_path_factory)


@pytest.fixture
def onceflow_airflow_cluster(
    onceflow_airflow_cluster_factory: Callable[..., AirflowCluster],
) -> AirflowCluster:
    """A started cluster on the session's DAG folder."""
    return onceflow_airflow_cluster_factory()


# -- PostgreSQL -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def onceflow_postgres_url_factory() -> Iterator[Callable[..., str]]:
    """``factory(tag="test")`` -> URL of a fresh empty database, dropped at session end.

    In CI (``CI=true`` or ``ONCEFLOW_TEST_DATABASE_URL`` set) an unreachable server fails the
    test; elsewhere it skips it.
    """
    from onceflow.testing.postgres import url_factory

    yield from url_factory()


@pytest.fixture
def onceflow_postgres_url(
    onceflow_postgres_url_factory: Callable[..., str], request: pytest.FixtureRequest
) -> str:
    """A fresh, empty PostgreSQL database for this test (SQLAlchemy URL, psycopg2 driver)."""
    return onceflow_postgres_url_factory(request.node.name[:20])


@pytest.fixture
def onceflow_free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    from onceflow.testing.ports import free_port

    return free_port()


# -- Sheets API emulator, GCS, ledger, sales, article site -----------------------------------------
# Declared here, served by the modules named in each: one small module for pytest to load and
# register in every session, the machinery imported only when a test asks for the fixture.


@pytest.fixture
def onceflow_sheets_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SheetsEmulator]:
    """A fresh Sheets API emulator per test, with ``AIRFLOW_CONN_ONCEFLOW_SHEETS`` pointing at it
    (:mod:`onceflow.testing.sheets_fixtures`)."""
    from onceflow.testing.sheets_fixtures import emulator

    yield from emulator(tmp_path, monkeypatch)


@pytest.fixture
def onceflow_queue_sheet(
    onceflow_sheets_emulator: SheetsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[list[str]]], str]:
    """``make(rows)``: a queue spreadsheet (tab ``queue``, ``CLAIMED_QUEUE_HEADER``) on the
    emulator holding ``rows``, with connection ``onceflow_sheets`` pointing at it; its id."""
    from onceflow.testing.sheets_fixtures import queue_sheet

    return queue_sheet(onceflow_sheets_emulator, monkeypatch)


@pytest.fixture
def onceflow_sheets_emulator_factory(tmp_path: Path) -> Iterator[Callable[..., SheetsEmulator]]:
    """Make more emulators: ``factory(state=<tmp file>, port=0)``; ``state=None`` keeps state in
    memory only. Every one is stopped at teardown. It sets no connection: use ``.connection_json()``."""
    from onceflow.testing.sheets_fixtures import emulator_factory

    yield from emulator_factory(tmp_path)


@pytest.fixture(scope="session")
def onceflow_fake_gcs() -> Iterator[FakeGcs]:
    """One fake-gcs-server for the session; make a bucket per test with ``onceflow_fake_gcs.bucket()``
    (:mod:`onceflow.testing.gcs_fixtures`)."""
    from onceflow.testing.gcs_fixtures import fake_gcs

    yield from fake_gcs()


@pytest.fixture
def onceflow_fake_clock() -> FakeClock:
    """A :class:`~onceflow.testing.clock.FakeClock`: time moves only when told."""
    from onceflow.testing.clock import FakeClock

    return FakeClock()


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def onceflow_ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty ledger database URL: a SQLite file, or (``postgres`` mark) a PostgreSQL database."""
    from onceflow.testing.ledger_fixtures import ledger_url

    return ledger_url(request, tmp_path)


@pytest.fixture
def onceflow_ledger(onceflow_ledger_url: str, onceflow_fake_clock: FakeClock) -> Iterator[Ledger]:
    """A :class:`~onceflow.ledger.Ledger` on ``onceflow_ledger_url`` (both backends) using ``onceflow_fake_clock``."""
    from onceflow.testing.ledger_fixtures import open_ledger

    yield from open_ledger(onceflow_ledger_url, onceflow_fake_clock)


@pytest.fixture
def onceflow_sqlite_ledger(tmp_path: Path, onceflow_fake_clock: FakeClock) -> Iterator[Ledger]:
    """The same ledger on SQLite only, for tests that do not need both backends."""
    from onceflow.testing.ledger_fixtures import open_ledger

    yield from open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}", onceflow_fake_clock)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def onceflow_sales_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh empty database: a SQLite file, or (``postgres`` marker) a PostgreSQL database
    (:mod:`onceflow.testing.sales_fixtures`)."""
    from onceflow.testing.sales_fixtures import sales_db_url

    return sales_db_url(request, tmp_path)


@pytest.fixture
def onceflow_shop_orders() -> Callable[..., list[OrderRow]]:
    """``shop_orders(url, start, end, ingested_before=None, **config)`` -> rows written."""
    from onceflow.testing.sales_fixtures import shop_orders

    return shop_orders()


@pytest.fixture
def onceflow_sales_connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str, str], Path]:
    """Point ``onceflow_shop_db`` and ``onceflow_warehouse`` at two URLs; returns the staging dir."""
    from onceflow.testing.sales_fixtures import sales_connections

    return sales_connections(monkeypatch, tmp_path)


@pytest.fixture
def onceflow_article_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArticleSite]:
    """The demo article site for one test, allowed by the ``onceflow_fetch`` connection
    (:mod:`onceflow.testing.article_fixtures`)."""
    from onceflow.testing.article_fixtures import article_site

    yield from article_site(tmp_path, monkeypatch)
