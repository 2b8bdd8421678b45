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


def messy_day(day: dt.date, seed: int, orders: int = 400) -> Any:
    """A generated day (a source frame) with conflicts, ties and NULLs added, row ids sparse and
    rows shuffled: what cleaning's property tests compare the bounded clean and the staging
    formats on."""
    import random

    import pandas as pd

    from onceflow.sales.generator import GeneratorConfig

    config = GeneratorConfig(
        seed=seed, orders_per_day=orders, refund_rate=0.3, duplicate_rate=0.15, malformed_per_day=6
    )
    df = source_frame(day, config)
    rng = random.Random(seed)
    rows = df.to_dict("records")
    extra: list[dict[str, object]] = []
    sales = [r for r in rows if r["event_type"] == "sale" and r["order_id"]]
    refunds = [r for r in rows if r["event_type"] == "refund" and r["refund_id"]]
    later = dt.timedelta(seconds=rng.randint(1, 90))
    for r in rng.sample(sales, len(sales) // 10):  # a corrected amount, later or earlier
        extra.append(
            {
                **r,
                "amount": f"{rng.randint(100, 9999) / 100:.2f}",
                "ingested_at_utc": r["ingested_at_utc"] + rng.choice([later, -later]),
            }
        )
    for r in rng.sample(sales, len(sales) // 20):  # another currency under the same order id
        extra.append({**r, "currency": "SEK" if r["currency"] != "SEK" else "GBP"})
    for r in rng.sample(sales, len(sales) // 20):  # the same amount written differently: a repeat
        extra.append({**r, "amount": str(float(r["amount"])), "ingested_at_utc": r["ingested_at_utc"]})
    for r in rng.sample(refunds, len(refunds) // 3):  # the refund id reused on another order
        other = rng.choice(sales)
        extra.append({**r, "order_id": other["order_id"], "ingested_at_utc": r["ingested_at_utc"] + later})
    for r in rng.sample(sales, len(sales) // 15):  # customer NULL on the sale, a refund names one
        r["customer_id"] = None
        extra.append(
            {
                **r,
                "event_type": "refund",
                "refund_id": f"RN-{r['order_id']}",
                "customer_id": "C-refund",
                "amount": "1.00",
            }
        )
    for r in rng.sample(sales, len(sales) // 20):  # a refund of an order sold on an earlier day
        extra.append(
            {
                **r,
                "order_id": f"OLD-{r['order_id']}",
                "event_type": "refund",
                "refund_id": f"RO-{r['order_id']}",
                "customer_id": None,
            }
        )
    for i in range(8):  # malformed in ways the generator does not make
        base = rng.choice(sales)
        malformed: list[dict[str, object]] = [{"order_id": "O\x00" + str(i)}, {"customer_id": "C\udcff"}, {"order_id": "O" * 65},
               {"amount": "10.001"}, {"amount": None}, {"currency": None}, {"order_id": "   "},
               {"event_type": None}]  # fmt: skip
        extra.append({**base, **malformed[i]})
    rows += extra
    rng.shuffle(rows)
    ids = rng.sample(range(1, 40 * len(rows)), len(rows))  # unique, sparse, in no particular order
    for r, row_id in zip(rows, ids, strict=True):
        r["row_id"] = row_id
    text = {"order_id", "event_type", "refund_id", "customer_id", "amount", "currency"}
    # Text as plain objects, as the extract hands it over: pandas' string dtype refuses surrogates.
    return pd.DataFrame(
        {c: pd.Series([r[c] for r in rows], dtype=object if c in text else None) for c in df.columns}
    )


def order_columns(frame: Any) -> dict[str, list[Any]]:
    """A source frame as the shop query's batch (``shop_query.rows_columns``): plain Python values,
    what the extract stages (as text for a small day)."""
    import pandas as pd

    from onceflow.sales.schema import ORDER_COLUMNS

    def plain(v: Any) -> Any:
        if v is None or v is pd.NaT or (isinstance(v, float) and v != v):
            return None
        return v.to_pydatetime() if isinstance(v, pd.Timestamp) else v

    columns = {c: [plain(v) for v in frame[c]] for c in ORDER_COLUMNS}
    columns["row_id"] = [int(v) for v in columns["row_id"]]
    return columns
