"""The load task's answer to a staged clean it cannot read: a manifest naming a staging format this
version does not know (another onceflow version cleaned, a rolling deployment) fails the task at
once, without retries (waiting does not change the files; clearing clean does), and loads nothing,
not the parquet files an earlier try may have left beside it."""

from __future__ import annotations

import datetime as dt
import json
import types
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.testing.sales_fixtures import messy_day, order_columns

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

DAY = dt.date(2024, 10, 27)


def test_an_unknown_staging_format_fails_the_load_without_retries(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sales_db_url: str,
    sales_connections: Callable[[str, str], Path],
) -> None:
    from onceflow.compat import AirflowFailException
    from onceflow.operators.partition import PartitionOverwriteOperator
    from onceflow.sales import staging
    from onceflow.sales.text_staging import TEXT_ROWS_ENV

    sales_connections(f"sqlite:///{tmp_path / 'shop.db'}", sales_db_url)
    folder = tmp_path / "run"
    monkeypatch.setenv(TEXT_ROWS_ENV, "0")  # an earlier try's complete parquet clean
    staging.write_extract_stream(folder, [order_columns(messy_day(DAY, 1, 20))])
    staging.clean_extract(folder, partition=DAY, processing_version="v")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format": "arrow-ipc"}))

    load = PartitionOverwriteOperator(
        task_id="load", partition=DAY.isoformat(), staging_dir=str(folder), ledger_conn_id=None
    )
    context: Any = {"run_id": "scheduled__x", "ti": types.SimpleNamespace(try_number=1, dag_id="daily_sales")}
    with pytest.raises(AirflowFailException, match="names staging format 'arrow-ipc'"):
        load.execute(context)
    store = PartitionStore(make_engine(sales_db_url), "daily_sales")
    store.create_schema()
    assert store.audit(DAY) is None and store.partition_rows(DAY) == []
