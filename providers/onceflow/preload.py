"""Import daily_sales' task-side libraries once in the process that forks the task processes.

Where the time of a daily_sales run goes (``benchmarks/bench_backfill.py`` measures it per task):
each of its three task processes imports pyarrow (with numpy), SQLAlchemy and a database driver,
and before issue 27 pandas too (about 1.5 s of CPU on our 2-core VM then), while the work itself is
a few tenths of a second. Airflow 3 on Linux starts every
task process with ``os.fork()`` from an executor worker (LocalExecutor workers are forked from the
scheduler; Celery workers fork their own), so whatever that process imported is already loaded in
every task, for free: the pages are shared copy-on-write.

:func:`preload_for_task_forks` imports :data:`TASK_MODULES` when the current process is one that
forks tasks (``airflow scheduler`` or ``airflow celery worker``) and does nothing elsewhere. Call
it from ``airflow_local_settings.py`` (Airflow imports that file in every process before the
executor starts), e.g. ``$AIRFLOW_HOME/config/airflow_local_settings.py``::

    from onceflow.preload import preload_for_task_forks

    preload_for_task_forks()

After the imports it runs :data:`WARM_UPS`: the article chain's language detector (lingua's models
of the default languages), which ``extract`` and ``score`` would otherwise build in every task
process, about 1.2 s of CPU each, twice per article; and the Sheets API's resources
(:mod:`onceflow.sheets.service`), which each task that touches the sheet would otherwise build,
about 0.2 s of CPU each.

It is a deployment choice, not something the DAG does: the forking process keeps about 150 MB
more resident for the imports and 200 MB more for the detector (measured on Linux, Python 3.11;
``warm_ups=()`` leaves the detector out where the article chain does not run), and with one
process per task (KubernetesExecutor) there is nothing to share.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

#: onceflow modules the sales tasks import that do not import Airflow, with what they import (the
#: sales staging, cleaning and loading, the work ledger). A scheduler started before an upgrade
#: of onceflow keeps these versions in every task it forks: restart it after ``pip install``, as
#: for any library it imported (docs/deploy.md).
ONCEFLOW_TASK_MODULES: tuple[str, ...] = (
    "onceflow.sales.shop_query",
    "onceflow.sales.staging",
    "onceflow.sales.clean_stream",
    "onceflow.sales.partition_store",
    "onceflow.sales.ledger_link",  # with onceflow.shutdown and the ledger's worker
    "onceflow.ledger.core",  # the Ledger the load opens (LedgerHook): the package loads it lazily
    "onceflow.ledger.migrations",  # LedgerHook's schema check
    "onceflow.sales.engine",  # the hooks' engines
    "onceflow.sales.config",  # the DAG file's settings (read from the environment when called)
)

#: The costly imports of the extract, clean and load tasks (``pyarrow.parquet`` pulls in pyarrow
#: and numpy; parquet reads import ``pyarrow.dataset``; a ledger migration imports Alembic, ~0.1 s).
#: No task imports pandas any more (``tests/integration/test_sales_tasks_without_pandas.py``), so
#: preloading it would only cost the forking process memory.
#: ``airflow_local_settings`` is imported while Airflow itself initialises, so no module listed here
#: may import Airflow (onceflow's hooks and operators do; ``tests/unit/test_preload.py`` checks).
TASK_MODULES: tuple[str, ...] = (
    "pyarrow.parquet",
    "pyarrow.dataset",
    "sqlalchemy",
    "psycopg2",
    "alembic.command",
    "alembic.script",
    "alembic.runtime.migration",
    # onceflow's own Airflow-free modules of the three sales tasks and the work ledger: 25 to 35
    # modules a task imported itself, 20 to 30 ms of CPU per backfilled run (3 tasks). They hold
    # constants only: settings are read when a task calls them, not at import.
    *ONCEFLOW_TASK_MODULES,
    # The article chain's: the Google provider's hooks (Sheets, storage) pull in the API client,
    # gRPC and Secret Manager's client (about 0.35 s of CPU per task process), page extraction.
    "googleapiclient.discovery",
    "google.api_core.gapic_v1",
    "google.cloud.secretmanager_v1",
    "gcloud.aio.auth.token",
    "trafilatura",
    "lingua",
)

#: ``module:function`` run after the imports, whose results stay in memory for every forked task:
#: lingua builds the detector's models in Rust memory the tasks only read, so the pages stay shared.
#: Like the imports, they must not import Airflow.
#: The Sheets API resources (about 0.2 s of CPU in every task process that touches the sheet,
#: mostly google-api-python-client writing method docstrings) are built here for Google's endpoint
#: and the ``ONCEFLOW_SHEETS_API_ENDPOINTS`` ones (an emulator's); no credentials are in them.
WARM_UPS: tuple[str, ...] = ("onceflow.articles.language:warm", "onceflow.sheets.service:warm")

#: What :func:`write_local_settings` adds to ``airflow_local_settings.py``.
LOCAL_SETTINGS = "from onceflow.preload import preload_for_task_forks\n\npreload_for_task_forks()\n"

#: ``airflow <command>`` of the processes that fork task processes.
FORKING_COMMANDS: tuple[tuple[str, ...], ...] = (("scheduler",), ("celery", "worker"))


def forks_tasks(argv: Sequence[str] | None = None) -> bool:
    """Whether this process is an ``airflow scheduler`` or ``airflow celery worker``."""
    args = [a for a in (sys.argv if argv is None else argv)[1:] if not a.startswith("-")]
    return any(tuple(args[: len(cmd)]) == cmd for cmd in FORKING_COMMANDS)


def preload(modules: Sequence[str] = TASK_MODULES) -> list[str]:
    """Import ``modules``; return the ones that would not import (skipped, with a log line).

    Any error is skipped, not only ImportError: this runs inside ``airflow_local_settings``, and
    Airflow lets anything else out of it, so a broken install (pandas built against another numpy
    raises ValueError) would stop the scheduler from starting for the sake of a speed-up.
    """
    return [name for name in modules if not _attempt(name, partial(importlib.import_module, name))]


def _attempt(what: str, action: Callable[[], object]) -> bool:
    """Run ``action``; False, logged, when it fails (a missing extra is an info line, anything else
    a warning with its traceback): tasks then do it themselves."""
    try:
        action()
    except ImportError as exc:  # an extra not installed (no `sales`, no `articles`)
        log.info("onceflow preload: %s not importable (%s); tasks will do it themselves", what, exc)
    except Exception:
        log.warning("onceflow preload: %s failed; tasks will do it themselves", what, exc_info=True)
    else:
        return True
    return False


def warm_up(targets: Sequence[str] = WARM_UPS) -> list[str]:
    """Call each ``module:function`` of ``targets``; return the ones that failed (skipped, logged).

    As with :func:`preload`, a failure costs the speed-up only, never the scheduler's start.
    """
    return [target for target in targets if not _attempt(target, partial(_call, target))]


def _call(target: str) -> None:
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)()


def preload_for_task_forks(modules: Sequence[str] = TASK_MODULES, warm_ups: Sequence[str] = WARM_UPS) -> None:
    """:func:`preload` and :func:`warm_up` in a process that forks tasks (see the module
    docstring); else nothing."""
    if forks_tasks():
        preload(modules)
        warm_up(warm_ups)


def write_local_settings(airflow_home: Path) -> Path:
    """Add :data:`LOCAL_SETTINGS` to ``$AIRFLOW_HOME/config/airflow_local_settings.py`` (once; a
    file already there keeps its content). Returns the file."""
    from onceflow.local_settings import add_once

    return add_once(airflow_home, LOCAL_SETTINGS, marker="preload_for_task_forks()")
