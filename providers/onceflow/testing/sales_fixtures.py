"""The daily_sales flow behind the plugin's sales fixtures (``onceflow.testing.pytest_plugin``
declares them and imports this module when one is used), and expectations for its tests.

* ``onceflow_sales_db_url``: a warehouse/shop database URL, parametrized over a SQLite file and a fresh
  PostgreSQL database (the PostgreSQL case carries the ``postgres`` marker).
* ``onceflow_shop_orders``: ``onceflow_shop_orders(url, start, end, **config)`` writes deterministic generated orders
  into ``url`` and returns the rows written.
* ``onceflow_sales_connections``: ``onceflow_sales_connections(shop_url, warehouse_url)`` points the
  ``onceflow_shop_db`` and ``onceflow_warehouse`` connections (``AIRFLOW_CONN_*``) at two databases
  for the rest of the test, plus a per-test staging folder.

Airflow is never imported here at module level (the plugin configures it first).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pytest

    from onceflow.sales.generator import GeneratorConfig, OrderRow


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def sales_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """``onceflow_sales_db_url`` for its parameter: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return _sqlite_url(tmp_path / "sales.db")
    factory: Callable[..., str] = request.getfixturevalue("onceflow_postgres_url_factory")
    return factory("sales")


def shop_orders() -> Callable[..., list[OrderRow]]:
    """``shop_orders(url, start, end, ingested_before=None, **config)`` -> rows written."""
    from onceflow.sales.engine import make_engine
    from onceflow.sales.generator import GeneratorConfig, generate_orders, write_orders

    def write(
        url: str,
        start: dt.date,
        end: dt.date,
        *,
        ingested_before: dt.datetime | None = None,
        **config: Any,
    ) -> list[OrderRow]:
        rows = generate_orders(start, end, GeneratorConfig(**config))
        if ingested_before is not None:
            rows = [r for r in rows if r.ingested_at_utc < ingested_before]
        engine = make_engine(url)
        try:
            write_orders(engine, rows)
        finally:
            engine.dispose()
        return rows

    return write


def sales_connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str, str], Path]:
    """Point ``onceflow_shop_db`` and ``onceflow_warehouse`` at two URLs; returns the staging dir."""

    def point(shop_url: str, warehouse_url: str) -> Path:
        for conn_id, url in (("ONCEFLOW_SHOP_DB", shop_url), ("ONCEFLOW_WAREHOUSE", warehouse_url)):
            conn = {
                "conn_type": "sqlite" if url.startswith("sqlite") else "postgres",
                "extra": {"sqlalchemy_url": url},
            }
            monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id}", json.dumps(conn))
        staging = tmp_path / "staging"
        monkeypatch.setenv("ONCEFLOW_SALES_STAGING_DIR", str(staging))
        return staging

    return point


def source_frame(day: dt.date, config: GeneratorConfig, *, ingested_before: dt.datetime | None = None) -> Any:
    """The shop rows a run for ``day`` reads, computed without a database (for expectations).

    Events come from ``day`` and the three days before it (refunds arrive up to 72 hours late);
    ``row_id`` is the position in generation order, as a fresh database would assign it.
    """
    import pandas as pd

    from onceflow.sales.generator import generate_orders
    from onceflow.sales.partitions import day_bounds_utc

    rows = generate_orders(day - dt.timedelta(days=3), day + dt.timedelta(days=1), config)
    df = pd.DataFrame([r.as_dict() for r in rows])
    df.insert(0, "row_id", range(1, len(df) + 1))
    start, end = (b.replace(tzinfo=None) for b in day_bounds_utc(day, config.timezone))
    keep = (df["created_at_utc"] >= start) & (df["created_at_utc"] < end)
    if ingested_before is not None:
        keep &= df["ingested_at_utc"] < ingested_before
    return df[keep].reset_index(drop=True)


def clean_day(day: dt.date, config: GeneratorConfig, *, ingested_before: dt.datetime | None = None) -> Any:
    """:func:`~onceflow.sales.clean.clean_orders` of :func:`source_frame` (a ``CleanResult``)."""
    from onceflow.sales.clean import clean_orders

    return clean_orders(source_frame(day, config, ingested_before=ingested_before), partition=day)
