"""Tables of the daily_sales flow, as SQLAlchemy Core (portable across PostgreSQL and SQLite).

Shop database: ``orders`` (one row per sale or refund event, as the shop records it, including the
duplicates and malformed values that real shops produce). Warehouse: the sales table (name
configurable, default ``daily_sales``), ``rejects``, ``load_audit`` and ``load_fence`` (the one
fence per partition). Columns added after a warehouse was first created carry a server default or
are nullable, so :mod:`onceflow.sales.schema_upgrade` can add them in place from these definitions.

Timestamps are stored as naive UTC (``*_utc`` columns): SQLite has no timezone type and a single
convention keeps the two backends byte-identical. Money is stored as integer cents.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import sqlalchemy as sa

from onceflow.sales.partitions import validate_table_name

shop_metadata = sa.MetaData()

#: Width of the warehouse's id columns (``order_id``, ``customer_id``, ``rejects.order_id``).
#: PostgreSQL refuses a longer value; cleaning rejects such rows (``value_too_long``) first.
ID_LENGTH = 64

orders = sa.Table(
    "orders",
    shop_metadata,
    sa.Column("row_id", sa.Integer, primary_key=True, autoincrement=True),
    # Nullable and free text on purpose: the shop's webhook importer stores what it receives.
    sa.Column("order_id", sa.String(64)),
    sa.Column("event_type", sa.String(16)),
    sa.Column("refund_id", sa.String(64)),
    sa.Column("customer_id", sa.String(64)),
    sa.Column("created_at_utc", sa.DateTime, nullable=False),
    sa.Column("ingested_at_utc", sa.DateTime, nullable=False),
    sa.Column("amount", sa.String(32)),
    sa.Column("currency", sa.String(8)),
    sa.Index("ix_orders_created_at_utc", "created_at_utc"),
)

ORDER_COLUMNS: tuple[str, ...] = tuple(c.name for c in orders.columns)
#: The text columns of ``orders`` (staged as bytes, checked by cleaning for NUL and stray bytes).
ORDER_TEXT_COLUMNS: tuple[str, ...] = tuple(c.name for c in orders.columns if isinstance(c.type, sa.String))

# Columns of the warehouse sales table, in load order (the COPY/CSV layout).
SALES_COLUMNS: tuple[str, ...] = (
    "partition_date",
    "order_id",
    "customer_id",
    "source_currency",
    "gross_cents",
    "refund_cents",
    "net_cents",
    "event_count",
    "first_event_utc",
)

REJECT_COLUMNS: tuple[str, ...] = ("source_row_id", "order_id", "reason", "raw")


def sales_arrow_schema() -> Any:
    """The Arrow schema of sales rows (staged ``rows.parquet``, the load's record batches)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("partition_date", pa.date32()),
            ("order_id", pa.string()),
            ("customer_id", pa.string()),
            ("source_currency", pa.string()),
            ("gross_cents", pa.int64()),
            ("refund_cents", pa.int64()),
            ("net_cents", pa.int64()),
            ("event_count", pa.int64()),
            ("first_event_utc", pa.timestamp("us")),
        ]
    )


def sales_table(name: str, metadata: sa.MetaData) -> sa.Table:
    """The warehouse sales table named ``name`` (``schema.table`` allowed), validated first."""
    name = validate_table_name(name)
    schema, _, table = name.rpartition(".")
    existing = metadata.tables.get(name)
    if existing is not None:
        return existing
    return sa.Table(
        table,
        metadata,
        sa.Column("partition_date", sa.Date, nullable=False),
        sa.Column("order_id", sa.String(ID_LENGTH), nullable=False),
        sa.Column("customer_id", sa.String(ID_LENGTH)),
        sa.Column("source_currency", sa.String(8), nullable=False),
        sa.Column("gross_cents", sa.BigInteger, nullable=False),
        sa.Column("refund_cents", sa.BigInteger, nullable=False),
        sa.Column("net_cents", sa.BigInteger, nullable=False),
        sa.Column("event_count", sa.Integer, nullable=False),
        sa.Column("first_event_utc", sa.DateTime, nullable=False),
        sa.Index(f"ix_{table}_partition_date", "partition_date"),
        schema=schema or None,
    )


class WarehouseTables(NamedTuple):
    """The tables every sales table of one warehouse shares."""

    rejects: sa.Table
    audit: sa.Table
    fence: sa.Table


def warehouse_tables(metadata: sa.MetaData) -> WarehouseTables:
    """``rejects``, ``load_audit`` and ``load_fence``, created once per metadata."""
    if "rejects" in metadata.tables:
        return WarehouseTables(
            metadata.tables["rejects"], metadata.tables["load_audit"], metadata.tables["load_fence"]
        )
    rejects = sa.Table(
        "rejects",
        metadata,
        sa.Column("table_name", sa.String(128), nullable=False),
        sa.Column("partition_key", sa.String(10), nullable=False),
        sa.Column("source_row_id", sa.BigInteger, nullable=False),
        sa.Column("order_id", sa.String(ID_LENGTH)),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("raw", sa.Text, nullable=False),
        sa.Index("ix_rejects_table_partition", "table_name", "partition_key"),
    )
    load_audit = sa.Table(
        "load_audit",
        metadata,
        sa.Column("table_name", sa.String(128), primary_key=True),
        sa.Column("partition_key", sa.String(10), primary_key=True),
        sa.Column("row_count", sa.BigInteger, nullable=False),
        sa.Column("reject_count", sa.BigInteger, nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        # The partition's fence token (load_fence) the load committed under.
        sa.Column("fence_token", sa.BigInteger, nullable=False),
        sa.Column("processing_version", sa.String(64), nullable=False),
        sa.Column("loaded_at_utc", sa.DateTime, nullable=False),
        # Added in place (schema_upgrade): the work ledger's token of a ledger-fenced load (NULL
        # for warehouse-lease loads), and when the loaded extract read the shop (NULL: unknown).
        sa.Column("ledger_token", sa.BigInteger, nullable=True),
        sa.Column("source_watermark_utc", sa.DateTime, nullable=True),
        # Added in place: exact repeats the cleaning dropped (rows that differ as events are
        # rejects, counted in reject_count). NULL: loaded before it was counted.
        sa.Column("duplicate_count", sa.BigInteger, nullable=True),
    )
    load_fence = sa.Table(
        "load_fence",
        metadata,
        sa.Column("table_name", sa.String(128), primary_key=True),
        sa.Column("partition_key", sa.String(10), primary_key=True),
        sa.Column("work_key", sa.String(200), nullable=False),
        # One sequence per partition: every attempt of either mode takes the next token; only the
        # holder of the newest may overwrite.
        sa.Column("fence_token", sa.BigInteger, nullable=False),
        sa.Column("committed_token", sa.BigInteger, nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("updated_at_utc", sa.DateTime, nullable=False),
        # Added in place (schema_upgrade): the newest work-ledger token registered (an older ledger
        # lease is refused even if it registers last), the holder's mode (``ledger`` or
        # ``warehouse``) and, for warehouse leases, until when other runs are kept out.
        sa.Column("ledger_token", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("fenced_by", sa.String(16), nullable=False, server_default="ledger"),
        sa.Column(
            "expires_at_utc", sa.DateTime, nullable=False, server_default=sa.text("'1970-01-01 00:00:00'")
        ),
    )
    return WarehouseTables(rejects, load_audit, load_fence)
