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
  and sales fixtures, from the modules listed below.
* ``onceflow_network_refusals``: the network guard's refusal log (take what a test provoked).

The network guard (``onceflow_network_guard = true``, opt-in) refuses every connection and name
lookup beyond loopback in pytest and in every Python process the tests start, and fails the test
during which one was attempted (:mod:`onceflow.testing.network_guard`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Imports nothing of onceflow (and so nothing of SQLAlchemy, Airflow or the emulators) until a
# session enables a feature or a test uses a fixture: pytest loads this module, by the pytest11
# entry point, in every session of any project where onceflow is installed
# (benchmarks/bench_pytest_plugin_import.py measures what it adds to such a project's session).
if TYPE_CHECKING:
    from onceflow.testing.airflow_cluster import AirflowCluster
    from onceflow.testing.airflow_env import AirflowTestEnv
    from onceflow.testing.dag_runner import DagRunResult
    from onceflow.testing.network_guard import Refusal, RefusalLog

pytest_plugins = [
    "onceflow.testing.sheets_fixtures",
    "onceflow.testing.gcs_fixtures",
    "onceflow.testing.ledger_fixtures",
    "onceflow.testing.sales_fixtures",
    "onceflow.testing.article_fixtures",
]

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
    from onceflow.testing import postgres
    from onceflow.testing.airflow_cluster import AirflowCluster, set_pools
    from onceflow.testing.celery_cluster import CeleryCluster

    made: list[AirflowCluster] = []

    def factory(
        *,
        dags_folder: Path | str | None = None,
        env: dict[str, str] | None = None,
        pools: dict[str, int] | None = None,
        parallelism: int = 8,
        timeout: float = 180.0,
        executor: str = "local",
        celery: dict[str, Any] | None = None,
    ) -> AirflowCluster:
        if executor not in {"local", "celery"}:
            raise ValueError(f"executor must be 'local' or 'celery', not {executor!r}")
        if executor == "celery" and not onceflow_airflow_db.is_postgres:
            reason = (
                "the Celery topology needs a PostgreSQL metadata DB (two schedulers lock rows): "
                f"set {postgres.ENV_VAR}=postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
            )
            if postgres.postgres_required():
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        if pools:
            set_pools(pools)
        workdir = tmp_path_factory.mktemp(f"{executor}-cluster")
        folder = Path(dags_folder) if dags_folder else None
        cluster: AirflowCluster
        if executor == "celery":
            cluster = CeleryCluster(
                onceflow_airflow_db.variables,
                workdir,
                dags_folder=folder,
                env=env,
                parallelism=parallelism,
                **(celery or {}),
            )
        else:
            cluster = AirflowCluster(
                onceflow_airflow_db.variables, workdir, dags_folder=folder, env=env, parallelism=parallelism
            )
        made.append(cluster)
        return cluster.start(timeout=timeout)

    yield factory
    problems: list[str] = []
    for cluster in made:
        # Each in its own try: one failing stop() must not leave the other clusters running.
        try:
            cluster.stop()
        except Exception as exc:
            problems.append(f"{cluster.marker}: stop() failed: {exc!r}")
        if leftovers := cluster.leftover_pids():
            problems.append(f"{cluster.marker}: survived teardown: {leftovers}")
    if problems:
        pytest.fail("onceflow: Airflow cluster teardown: " + "; ".join(problems))


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
    from onceflow.testing import postgres

    created: list[str] = []

    def factory(tag: str = "test") -> str:
        try:
            url = postgres.create_database(tag)
        except postgres.PostgresUnavailable as exc:
            if postgres.postgres_required():
                pytest.fail(f"PostgreSQL is required here: {exc}", pytrace=False)
            pytest.skip(f"PostgreSQL unavailable: {exc}")
        created.append(url)
        return url

    yield factory
    for url in created:
        with contextlib.suppress(postgres.PostgresUnavailable):
            postgres.drop_database(url)


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
