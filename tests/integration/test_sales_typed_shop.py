"""daily_sales against a PostgreSQL shop with real column types (``bigint``, ``numeric(12,2)``,
``timestamptz``) and its session time zone set to Europe/Amsterdam: plain SQL over the warehouse
equals plain SQL over the shop, and a refund id reused on two orders is one loaded, one rejected.

Runs the DAG's own tasks with ``dag.test()`` (real metadata DB), PostgreSQL shop, warehouse and ledger.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.postgres

DAY = dt.date(2024, 10, 27)  # 25 hours in Amsterdam: [2024-10-26 22:00Z, 2024-10-27 23:00Z)
START, END = "2024-10-26 22:00:00+00", "2024-10-27 23:00:00+00"
TYPED_ORDERS = """
CREATE TABLE orders (
    row_id bigserial PRIMARY KEY,
    order_id text, event_type text, refund_id text,
    customer_id bigint,
    created_at_utc timestamptz NOT NULL,
    ingested_at_utc timestamptz NOT NULL,
    amount numeric(12,2),
    currency text
)"""
BIG_CUSTOMER = 9007199254740993  # 2**53 + 1: a float would change it
# (order, type, refund, customer, created (with offset), ingested, amount)
EVENTS: list[tuple[Any, ...]] = [
    ("A", "sale", None, BIG_CUSTOMER, "2024-10-27 00:00:00+02", "2024-10-27 00:00:05+02", "14.02"),
    ("B", "sale", None, 42, "2024-10-27 12:30:00+01", "2024-10-27 12:30:01+01", "30.10"),
    ("C", "sale", None, 7, "2024-10-27 23:59:59.999999+01", "2024-10-28 00:00:03+01", "0.10"),
    ("OUT1", "sale", None, 1, "2024-10-26 23:59:59.999999+02", "2024-10-27 00:00:01+02", "5.00"),
    ("OUT2", "sale", None, 1, "2024-10-28 00:00:00+01", "2024-10-28 00:00:01+01", "5.00"),
    ("A", "refund", "R1", BIG_CUSTOMER, "2024-10-27 09:00:00+01", "2024-10-27 09:00:01+01", "4.02"),
    # R1 again, on another order: a different refund, not a repeat; the later-ingested one wins
    ("B", "refund", "R1", 42, "2024-10-27 10:00:00+01", "2024-10-27 18:00:00+01", "10.00"),
]
LOSER_ROW_ID = 6  # the earlier-ingested R1 (order A)

WAREHOUSE_SQL = """
SELECT order_id, customer_id, gross_cents, refund_cents, net_cents, event_count, first_event_utc
FROM daily_sales WHERE partition_date = :day ORDER BY order_id"""
SHOP_SQL = f"""
SELECT order_id,
       (array_agg(customer_id::text ORDER BY event_type = 'refund', created_at_utc, row_id))[1],
       coalesce(sum(amount * 100) FILTER (WHERE event_type = 'sale'), 0)::bigint,
       coalesce(sum(amount * 100) FILTER (WHERE event_type = 'refund'), 0)::bigint,
       (coalesce(sum(amount * 100) FILTER (WHERE event_type = 'sale'), 0)
        - coalesce(sum(amount * 100) FILTER (WHERE event_type = 'refund'), 0))::bigint,
       count(*),
       min(created_at_utc) AT TIME ZONE 'UTC'
FROM orders
WHERE created_at_utc >= '{START}' AND created_at_utc < '{END}' AND row_id <> :loser
GROUP BY order_id ORDER BY order_id"""


def run_day(run_dag: Callable[..., Any], day: dt.date) -> Any:
    """Run daily_sales for local ``day`` (as test_sales_dag.run_day: the deadline alert dropped)."""
    import pendulum

    from onceflow.testing.dag_runner import load_dag

    dag = load_dag("daily_sales")
    dag.deadline = None
    nxt = day + dt.timedelta(days=1)
    return run_dag(dag, logical_date=pendulum.datetime(nxt.year, nxt.month, nxt.day, tz="Europe/Amsterdam"))


@pytest.fixture
def typed_shop_env(
    monkeypatch: pytest.MonkeyPatch,
    postgres_url_factory: Callable[[str], str],
    sales_connections: Callable[[str, str], Path],
) -> dict[str, str]:
    monkeypatch.setenv("ONCEFLOW_SALES_RETRIES", "0")
    monkeypatch.setenv("ONCEFLOW_SALES_MAX_REJECT_RATIO", "0.5")  # one reject in six rows is the point
    shop, warehouse, ledger = (postgres_url_factory(t) for t in ("shop", "warehouse", "ledger"))
    sales_connections(shop, warehouse)
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER",
        json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": ledger}}),
    )
    engine = make_engine(shop)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(TYPED_ORDERS)
            for order, kind, refund, customer, created, ingested, amount in EVENTS:
                conn.execute(
                    sa.text(
                        "INSERT INTO orders (order_id, event_type, refund_id, customer_id, created_at_utc,"
                        " ingested_at_utc, amount, currency) VALUES (:o, :k, :r, :c, CAST(:t AS timestamptz),"
                        " CAST(:i AS timestamptz), CAST(:a AS numeric), 'EUR')"
                    ),
                    {
                        "o": order,
                        "k": kind,
                        "r": refund,
                        "c": customer,
                        "t": created,
                        "i": ingested,
                        "a": amount,
                    },
                )
            # Every new session of the shop reads and writes times in Amsterdam.
            name = sa.engine.make_url(shop).database
            conn.exec_driver_sql(f"ALTER DATABASE \"{name}\" SET timezone TO 'Europe/Amsterdam'")
    finally:
        engine.dispose()
    return {"shop": shop, "warehouse": warehouse}


def test_a_typed_shop_day_loads_exactly_and_a_reused_refund_id_is_rejected_not_dropped(
    run_dag: Callable[..., Any], typed_shop_env: dict[str, str]
) -> None:
    shop = make_engine(typed_shop_env["shop"])
    with shop.connect() as conn:
        assert conn.exec_driver_sql("SHOW timezone").scalar_one() == "Europe/Amsterdam"
        expected = [tuple(r) for r in conn.execute(sa.text(SHOP_SQL), {"loser": LOSER_ROW_ID})]
    shop.dispose()
    assert [r[0] for r in expected] == ["A", "B", "C"]  # the boundary rows: D 00:00 in, D+1 00:00 out

    result = run_day(run_dag, DAY)
    assert result.state == "success", result.ti_states

    warehouse = make_engine(typed_shop_env["warehouse"])
    with warehouse.connect() as conn:
        loaded = [tuple(r) for r in conn.execute(sa.text(WAREHOUSE_SQL), {"day": DAY})]
    warehouse.dispose()
    assert loaded == expected
    assert loaded[0][1] == str(BIG_CUSTOMER) and loaded[0][2] == 1402  # not NULL, not rounded

    store = PartitionStore(make_engine(typed_shop_env["warehouse"]), "daily_sales")
    [reject] = store.partition_rejects(DAY)
    assert (reject["source_row_id"], reject["reason"], reject["order_id"]) == (
        LOSER_ROW_ID,
        "conflicting_duplicate",
        "A",
    )
    raw = json.loads(reject["raw"])
    assert (raw["refund_id"], raw["amount"], raw["customer_id"]) == ("R1", "4.02", str(BIG_CUSTOMER))
    audit = store.audit(DAY)
    assert audit is not None
    assert (audit.row_count, audit.reject_count, audit.duplicate_count) == (3, 1, 0)
