"""An isolated Airflow installation for one test session: its own AIRFLOW_HOME and metadata DB.

Airflow reads its configuration when ``airflow`` is first imported, so :func:`prepare` must run
before that (the pytest plugin calls it from ``pytest_configure``). The metadata database is
SQLite in the home folder by default, or a fresh PostgreSQL database when
``ONCEFLOW_TEST_DATABASE_URL`` is set.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.loopback_logs import write_local_settings
from onceflow.testing import postgres


@dataclass
class AirflowTestEnv:
    """Where the session's Airflow lives and the environment that points every process at it."""

    home: Path
    sql_alchemy_conn: str
    dags_folder: Path
    plugins_folder: Path
    postgres_database: str | None = None
    variables: dict[str, str] = field(default_factory=dict)
    migrated: bool = False

    @property
    def is_postgres(self) -> bool:
        return self.postgres_database is not None

    def apply(self) -> None:
        """Export the environment into this process (before ``import airflow``)."""
        os.environ.update(self.variables)

    def airflow_command(self) -> list[str]:
        """The ``airflow`` CLI of the interpreter running the tests."""
        return [sys.executable, "-m", "airflow"]

    def migrate(self) -> None:
        """Create or upgrade the metadata schema (``airflow db migrate``) once per session."""
        if self.migrated:
            return
        env = {**os.environ, **self.variables}
        proc = subprocess.run(
            [*self.airflow_command(), "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"airflow db migrate failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        self.migrated = True

    def cleanup(self) -> None:
        if self.postgres_database:
            with contextlib.suppress(postgres.PostgresUnavailable):
                postgres.drop_database(self.postgres_database)
        shutil.rmtree(self.home, ignore_errors=True)


def prepare(
    *,
    dags_folder: Path,
    plugins_folder: Path,
    use_postgres: bool | None = None,
    home: Path | None = None,
) -> AirflowTestEnv:
    """Create the home folder and decide the metadata database; nothing is imported from Airflow.

    :param dags_folder: the DAG folder every Airflow process of the session reads.
    :param plugins_folder: the plugins folder.
    :param use_postgres: force PostgreSQL (True) or SQLite (False); default: PostgreSQL when
        ``ONCEFLOW_TEST_DATABASE_URL`` is set.
    :param home: reuse this folder instead of a new temporary one.
    """
    home = home or Path(tempfile.mkdtemp(prefix="onceflow-airflow-"))
    home.mkdir(parents=True, exist_ok=True)
    # The scheduler's and triggerer's log servers listen on 127.0.0.1 only (Airflow's bind every
    # interface): no process a test starts answers from outside this machine.
    write_local_settings(home)
    if use_postgres is None:
        use_postgres = bool(os.environ.get(postgres.ENV_VAR))
    pg_url: str | None = None
    if use_postgres:
        pg_url = postgres.create_database("airflow")
        conn = pg_url
    else:
        conn = f"sqlite:///{home / 'airflow.db'}"
    variables = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conn,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__FERNET_KEY": "",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__LOGGING__DAG_PROCESSOR_CHILD_PROCESS_LOG_DIRECTORY": str(home / "logs" / "dag_processor"),
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        # The examples of the standard provider would otherwise join every DagBag.
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    return AirflowTestEnv(
        home=home,
        sql_alchemy_conn=conn,
        dags_folder=dags_folder,
        plugins_folder=plugins_folder,
        postgres_database=pg_url,
        variables=variables,
    )
