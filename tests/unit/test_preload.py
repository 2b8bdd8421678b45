"""onceflow.preload: only processes that fork tasks preload, and a missing library is skipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.preload import forks_tasks, preload


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["airflow", "scheduler"], True),
        (["airflow", "celery", "worker", "-q", "default"], True),
        (["airflow", "api-server"], False),
        (["airflow", "dag-processor"], False),
        (["airflow", "triggerer"], False),
        (["airflow", "celery", "flower"], False),
    ],
)
def test_only_processes_that_fork_tasks_preload(argv: list[str], expected: bool) -> None:
    assert forks_tasks(argv) is expected


def test_a_library_that_is_not_installed_is_skipped() -> None:
    assert preload(["json", "onceflow_no_such_module"]) == ["onceflow_no_such_module"]


def test_a_library_that_fails_to_import_is_skipped_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken install (e.g. pandas built against another numpy: ValueError) must not stop the scheduler."""
    (tmp_path / "onceflow_broken_lib.py").write_text("raise ValueError('numpy.dtype size changed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert preload(["json", "onceflow_broken_lib"]) == ["onceflow_broken_lib"]


def test_an_airflow_scheduler_process_imports_the_task_libraries_from_local_settings(
    tmp_path: object,
) -> None:
    """The way Airflow runs it: airflow_local_settings on the path, argv of the scheduler."""
    code = (
        "import sys; sys.argv = ['airflow', 'scheduler']\n"
        "from onceflow.preload import preload_for_task_forks; preload_for_task_forks()\n"
        "print('pyarrow.parquet' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_a_warm_up_that_fails_is_skipped_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "onceflow_warm_lib.py").write_text(
        "calls = []\ndef ok():\n    calls.append(1)\ndef broken():\n    raise RuntimeError('model file missing')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from onceflow.preload import warm_up

    failed = warm_up(["onceflow_warm_lib:broken", "onceflow_warm_lib:ok", "onceflow_no_such_module:f"])
    assert failed == ["onceflow_warm_lib:broken", "onceflow_no_such_module:f"]
    import onceflow_warm_lib

    assert onceflow_warm_lib.calls == [1]


def test_a_task_forked_from_a_preloaded_scheduler_finds_the_language_detector_built() -> None:
    """The detector is built once in the forking process; a forked task detects without building
    it (lingua's models live in Rust memory and its thread pool does not survive the fork: the
    child must still answer, not hang)."""
    code = (
        "import os, sys; sys.argv = ['airflow', 'scheduler']\n"
        "from onceflow.preload import preload_for_task_forks; preload_for_task_forks()\n"
        "from onceflow.articles import language\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    built = language._detector.cache_info().currsize\n"
        "    print(built, language.detect('Hola, esto es una prueba del detector de idioma.')[0], flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    built, language = out.stdout.split()
    assert (int(built), language) == (1, "es"), out.stderr


def test_a_task_forked_from_a_preloaded_scheduler_finds_the_sheets_resources_built() -> None:
    """Google's and the configured endpoint's resources are built before the fork: a transport in
    the child builds no service (only the connection's http is the child's own)."""
    code = (
        "import os, sys; sys.argv = ['airflow', 'scheduler']\n"
        "os.environ['ONCEFLOW_SHEETS_API_ENDPOINTS'] = 'http://127.0.0.1:9/'\n"
        "from onceflow.preload import preload_for_task_forks; preload_for_task_forks()\n"
        "from google.api_core.client_options import ClientOptions\n"
        "from google.auth.credentials import AnonymousCredentials\n"
        "from google_auth_httplib2 import AuthorizedHttp\n"
        "from googleapiclient import discovery\n"
        "from onceflow.sheets import service\n"
        "from onceflow.sheets.transport import GoogleSheetsTransport\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    discovery.build = None  # a build in the child would fail\n"
        "    for endpoint in (None, 'http://127.0.0.1:9/'):\n"
        "        GoogleSheetsTransport.shared(AuthorizedHttp(AnonymousCredentials()), 'sid', ClientOptions(api_endpoint=endpoint))\n"
        "    print(len(service._built), flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["2"], out.stderr


def test_elsewhere_nothing_is_warmed() -> None:
    code = (
        "import sys; sys.argv = ['airflow', 'api-server']\n"
        "from onceflow.preload import preload_for_task_forks; preload_for_task_forks()\n"
        "from onceflow.articles import language\n"
        "print(language._detector.cache_info().currsize, 'lingua' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]


def test_the_preload_and_the_loopback_log_servers_share_one_settings_file_each_added_once(
    tmp_path: Path,
) -> None:
    """What the benchmarks and the harness do in turn: each addition lands once, in either order
    of repeats, and a file of the deployment's own keeps its content."""
    from onceflow.loopback_logs import write_local_settings as write_loopback
    from onceflow.preload import write_local_settings as write_preload

    path = tmp_path / "config" / "airflow_local_settings.py"
    path.parent.mkdir()
    path.write_text("def task_policy(task):\n    task.owner = 'ops'\n")
    for write in (write_preload, write_loopback, write_preload, write_loopback):
        assert write(tmp_path) == path
    text = path.read_text()
    assert text.startswith("def task_policy(task):")
    assert text.count("preload_for_task_forks()\n") == 1
    assert text.count("bind_log_servers_to_loopback()\n") == 1
    compile(text, str(path), "exec")  # still a module Airflow can import


def test_no_preloaded_module_imports_airflow() -> None:
    """airflow_local_settings runs while Airflow initialises: a listed module that imported Airflow
    would import it half-initialised. Each one, in a fresh interpreter, leaves Airflow unloaded."""
    from onceflow.preload import ONCEFLOW_TASK_MODULES, TASK_MODULES

    assert set(ONCEFLOW_TASK_MODULES) <= set(TASK_MODULES)
    code = (
        "import importlib, sys\n"
        "name = sys.argv[1]\n"
        "try:\n"
        "    importlib.import_module(name)\n"
        "except ImportError:\n"
        "    print('not installed')\n"
        "else:\n"
        "    print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))\n"
    )
    found = {}
    for name in TASK_MODULES:
        out = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, check=True)
        found[name] = out.stdout.strip()
    assert {n: f for n, f in found.items() if f not in ("[]", "not installed")} == {}
    # the onceflow ones are part of this checkout: they must really import, not be skipped
    assert {n: found[n] for n in ONCEFLOW_TASK_MODULES} == dict.fromkeys(ONCEFLOW_TASK_MODULES, "[]")


def test_a_task_forked_from_a_preloaded_scheduler_imports_no_onceflow_sales_module_itself() -> None:
    """The Airflow-free onceflow modules that the DAG file, extract, clean and load import are all
    preloaded (what is left to each task: hooks and operators, which import Airflow)."""
    code = (
        "import sys; sys.argv = ['airflow', 'scheduler']\n"
        "from onceflow.preload import preload_for_task_forks; preload_for_task_forks(warm_ups=())\n"
        "before = set(sys.modules)\n"
        "import onceflow.sales.staging, onceflow.sales.clean_stream, onceflow.sales.clean_rules\n"
        "import onceflow.sales.partition_store, onceflow.sales.ledger_link, onceflow.sales.shop_query\n"
        "import onceflow.ledger.worker, onceflow.shutdown, onceflow.sales.bulk_load, onceflow.sales.checksum\n"
        "import onceflow.sales.engine, onceflow.sales.config\n"
        # what LedgerHook.get_ledger() imports in the load (onceflow.ledger loads its parts lazily)
        "from onceflow.ledger import Ledger, create_ledger_engine\n"
        "from onceflow.ledger.migrations import current_revision, head\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('onceflow')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
