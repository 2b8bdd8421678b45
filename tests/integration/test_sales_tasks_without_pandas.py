"""No daily_sales task imports pandas (issue 27): extract, clean and load.

pandas costs about 0.2 to 0.3 s of CPU in every task process that imports it (three a run)
wherever the scheduler does not preload it (``onceflow.preload``; KubernetesExecutor cannot).
Here each task runs in a fresh Python process of its own, as Airflow runs a task, calling the DAG
file's own task (the extract's and clean's callables, the load operator's ``execute``) with an
import hook that refuses pandas, so any import of it on their paths, direct or through pyarrow's
pandas probes (``onceflow.sales.arrow_values``), fails the task. The stored partition is then
read back from the warehouse and compared with the reference clean of the same day (pandas,
``clean.clean_orders``), rejects included.

Not mocked: the shop, warehouse and ledger databases, the staging files, the DAG file. The
task context is built by hand (the interval, the run id, the try number): the code under test is
what the tasks import and do, not how Airflow starts them (``tests/acceptance`` runs daily_sales
under a real scheduler).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sales.checksum import rows_checksum
from onceflow.sales.engine import make_engine
from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partition_store import PartitionStore, frame_records
from onceflow.sales.schema import SALES_COLUMNS
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Callable

AMS = "Europe/Amsterdam"
# Malformed rows give the load rejects to insert; refunds and duplicates give clean work.
CONFIG = GeneratorConfig(seed=27, orders_per_day=120, malformed_per_day=6)
DAY = dt.date(2024, 6, 15)
RUN_ID = "scheduled__2024-06-15T22:00:00+00:00"

# One task in a process of its own, pandas refused from the first line on.
TASK = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, json, sys, types

    task_id, day, run_id, start, end, refused = sys.argv[1:7]
    refused = refused.split(",")

    import traceback

    class RefusePandas(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        # Found (a feature check with find_spec still sees pandas installed), never loaded; each
        # attempt is recorded, since pyarrow's probe swallows the ImportError.
        attempts = []

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in refused:
                return importlib.machinery.ModuleSpec(name, self)
            return None

        def create_module(self, spec):
            self.attempts.append("".join(traceback.format_stack(limit=12)[:-1]))
            raise ImportError(f"the {task_id} task imported {spec.name}; no task may need {refused}")

        def exec_module(self, module):
            raise AssertionError("unreachable")

    sys.meta_path.insert(0, RefusePandas())

    import pendulum
    from onceflow.testing.dag_runner import load_dag

    dag = load_dag("daily_sales")
    task = dag.get_task(task_id)
    context = {
        "dag": dag,
        "run_id": run_id,
        "ti": types.SimpleNamespace(try_number=1, dag_id=dag.dag_id, task_id=task_id),
        "data_interval_start": pendulum.parse(start),
        "data_interval_end": pendulum.parse(end),
    }
    if task_id == "load":
        task.partition = day  # the rendered template: sales_partition(data_interval_start, end)
        result = task.execute(context)
    else:
        result = task.python_callable(**context)
    report = {
        "result": result,
        "pandas": "pandas" in sys.modules,
        "loaded": sorted(m for m in refused if m in sys.modules),
        "attempts": RefusePandas.attempts,
    }
    print(json.dumps(report, default=str))
    """
)


def run_task(task_id: str, start: dt.datetime, end: dt.datetime, refused: tuple[str, ...]) -> dict[str, Any]:
    """Run ``task_id`` of daily_sales for :data:`DAY` in a fresh process with the ``refused``
    modules refused; its JSON report."""
    argv = [sys.executable, "-c", TASK, task_id, DAY.isoformat(), RUN_ID, start.isoformat(), end.isoformat()]
    argv.append(",".join(refused))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, f"{task_id} failed:\n{done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # Where a refused module was asked for, even where the asker went on without it (pyarrow's probe).
    assert not report["attempts"], f"{task_id} imported {refused}:\n" + "\n".join(report["attempts"][:2])
    assert report["loaded"] == []
    return report


#: what each staging format's tasks must never import: a day staged as text (the default for a
#: day this small) needs no Arrow and no numpy either (issue 27: 0.14 s of CPU a task).
REFUSED = {"text": ("pandas", "pyarrow", "numpy"), "parquet": ("pandas",)}


@pytest.mark.parametrize("staging_format", ["text", "parquet"])
def test_every_task_runs_without_pandas_and_stores_the_reference_partition(
    onceflow_airflow_db: Any,
    daily_sales_env: dict[str, str],
    shop_orders: Callable[..., Any],
    staging_format: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Warehouse and ledger on SQLite (INSERT) and on PostgreSQL (COPY), the day staged as text
    (no Arrow in any task) and as parquet."""
    import pendulum

    from onceflow.sales.text_staging import TEXT_ROWS_ENV

    if staging_format == "parquet":
        monkeypatch.setenv(TEXT_ROWS_ENV, "0")
    staging_dir = tmp_path / "staging"
    monkeypatch.setenv("ONCEFLOW_SALES_STAGING_DIR", str(staging_dir))
    refused = REFUSED[staging_format]

    shop_orders(
        daily_sales_env["shop"], DAY - dt.timedelta(days=3), DAY + dt.timedelta(days=2), **vars(CONFIG)
    )
    start = pendulum.datetime(DAY.year, DAY.month, DAY.day, tz=AMS)
    end = start.add(days=1)

    extract = run_task("extract", start, end, refused)
    expected = clean_day(DAY, CONFIG)
    assert extract["pandas"] is False
    assert extract["result"]["source_rows"] == expected.source_rows > 0

    clean = run_task("clean", start, end, refused)
    assert clean["pandas"] is False
    summary = clean["result"]
    assert (summary["rows"], summary["rejects"]) == (len(expected.rows), len(expected.rejects))
    assert len(expected.rejects) > 0 and expected.duplicates_dropped > 0
    assert summary["duplicates_dropped"] == expected.duplicates_dropped
    assert summary["reasons"] == expected.reasons()

    load = run_task("load", start, end, refused)
    assert load["pandas"] is False

    # Read back through the warehouse, not through what the load reported.
    store = PartitionStore(make_engine(daily_sales_env["warehouse"]), "daily_sales")
    assert store.partition_checksum(DAY) == rows_checksum(frame_records(expected.rows, SALES_COLUMNS))
    assert len(store.partition_rows(DAY)) == len(expected.rows)
    # Every column of every reject, as the reference clean gives it (NULL order ids included).
    stored_rejects = sorted(
        (int(r["source_row_id"]), r["order_id"], r["reason"], r["raw"]) for r in store.partition_rejects(DAY)
    )
    expected_rejects = sorted(
        (
            int(r["source_row_id"]),
            r["order_id"] if isinstance(r["order_id"], str) else None,
            r["reason"],
            r["raw"],
        )
        for r in expected.rejects.to_dict("records")  # a frame holds a missing order id as NaN
    )
    assert stored_rejects == expected_rejects
    audit = store.audit(DAY)
    assert audit is not None and load["result"]["checksum"] == audit.checksum
    assert (audit.row_count, audit.reject_count) == (len(expected.rows), len(expected.rejects))
    staged = {p.name for p in staging_dir.rglob("*") if p.is_file()}
    names = ["extract", "rows", "rejects"]
    suffix = "tsv" if staging_format == "text" else "parquet"
    assert staged == {f"{n}.{suffix}" for n in names} | {"manifest.json"}, staged
