"""Awkward text survives every load path: NULL stays NULL, "" stays "", on SQLite and PostgreSQL.

The rows are generated (seeded) from the values that break CSV and COPY: NULLs, empty strings,
quotes, commas, newlines, carriage returns, tabs, backslashes, a literal ``\\N``, ``\\.``, and
non-ASCII text. They go through :meth:`PartitionStore.overwrite` (COPY on PostgreSQL with psycopg2
and psycopg 3, INSERT on SQLite) and are read back with plain SQL, not through the store.
"""

from __future__ import annotations

import datetime as dt
import random

import pandas as pd
import pyarrow as pa
import pytest
import sqlalchemy as sa

from onceflow.sales.clean import PROCESSING_VERSION, normalise_sales_frame
from onceflow.sales.engine import make_engine
from onceflow.sales.partition_store import PartitionStore
from onceflow.sales.schema import sales_arrow_schema

DAY = dt.date(2024, 3, 31)
PIECES = [
    "",
    '"',
    "'",
    ",",
    "\n",
    "\r\n",
    "\t",
    "\\",
    "\\N",
    "\\.",
    "N",
    " ",
    "é",
    "Ø",
    "漢字",
    "🙂",
    "a",
    "7",
    ";",
]


def awkward_text(rng: random.Random, *, max_pieces: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces)))


def awkward_rows(seed: int, n: int) -> pd.DataFrame:
    rng = random.Random(seed)
    base = dt.datetime(2024, 3, 30, 23, 0)
    customers = [None, "", "\\N", "NULL", '""', "\n"]
    rows = []
    for i in range(n):
        customer = (
            customers[i] if i < len(customers) else rng.choice([None, "", awkward_text(rng, max_pieces=8)])
        )
        gross = rng.randint(0, 10**7)
        refund = rng.randint(0, gross)
        rows.append(
            {
                "partition_date": DAY,
                # Unique (the rows are compared as a set) but just as awkward.
                "order_id": f"{i:04d}{awkward_text(rng, max_pieces=10)}",
                "customer_id": customer,
                "source_currency": rng.choice(["EUR", "", "\\N", "a,b", 'q"', "Kč", "\t"]),
                "gross_cents": gross,
                "refund_cents": refund,
                "net_cents": gross - refund,
                "event_count": rng.randint(1, 5),
                "first_event_utc": base + dt.timedelta(microseconds=rng.randint(0, 23 * 3600 * 10**6)),
            }
        )
    return normalise_sales_frame(pd.DataFrame(rows))


def stored_rows(engine: sa.Engine) -> set[tuple[object, ...]]:
    """The partition's rows by plain SQL; timestamps normalised (SQLite returns text)."""
    with engine.connect() as conn:
        result = conn.execute(
            sa.text(
                "SELECT order_id, customer_id, source_currency, gross_cents, refund_cents, net_cents, "
                "event_count, first_event_utc FROM daily_sales WHERE partition_date = :day"
            ),
            {"day": DAY.isoformat() if engine.dialect.name == "sqlite" else DAY},
        ).all()
    return {
        (*r[:7], r[7] if isinstance(r[7], dt.datetime) else dt.datetime.fromisoformat(r[7])) for r in result
    }


def expected_rows(frame: pd.DataFrame) -> set[tuple[object, ...]]:
    return {
        (r.order_id, r.customer_id, r.source_currency, r.gross_cents, r.refund_cents, r.net_cents,
         r.event_count, r.first_event_utc.to_pydatetime())
        for r in frame.astype(object).where(frame.notna(), None).itertuples()
    }  # fmt: skip


def load_and_compare(url: str, method: str, seed: int, *, arrow: bool = False) -> None:
    """``arrow``: the rows as Arrow record batches of 70 (formatted and checksummed by Arrow, as
    the operator streams them), else one frame (pandas)."""
    frame = awkward_rows(seed, 300)
    assert frame["customer_id"].isna().any() and (frame["customer_id"] == "").any()
    rows: object = frame
    if arrow:
        table = pa.Table.from_pandas(frame, schema=sales_arrow_schema(), preserve_index=False)
        rows = table.to_batches(max_chunksize=70)
    engine = make_engine(url)
    try:
        store = PartitionStore(engine, "daily_sales")
        store.create_schema()
        lease = store.acquire_lease(DAY, run_id=f"awkward_{seed}", try_number=1)
        audit = store.overwrite(lease, rows, None, processing_version=PROCESSING_VERSION, method=method)  # type: ignore[arg-type]
        stored = stored_rows(engine)
        expected = expected_rows(frame)
        assert stored == expected, sorted(stored ^ expected, key=repr)[:6]
        with engine.connect() as conn:
            nulls, empties = conn.execute(
                sa.text(
                    "SELECT SUM(CASE WHEN customer_id IS NULL THEN 1 ELSE 0 END), "
                    "SUM(CASE WHEN customer_id = '' THEN 1 ELSE 0 END) FROM daily_sales"
                )
            ).one()
        assert (nulls, empties) == (frame["customer_id"].isna().sum(), (frame["customer_id"] == "").sum())
        assert store.partition_checksum(DAY) == audit.checksum
    finally:
        engine.dispose()


@pytest.mark.parametrize("arrow", [False, True], ids=["frame", "arrow"])
@pytest.mark.parametrize("seed", [1, 2])
def test_stored_rows_equal_the_frame_with_nulls_empty_strings_and_awkward_text(
    sales_db_url: str, seed: int, arrow: bool
) -> None:
    load_and_compare(sales_db_url, "auto", seed, arrow=arrow)  # COPY on PostgreSQL, INSERT on SQLite


@pytest.mark.postgres
@pytest.mark.parametrize("arrow", [False, True], ids=["frame", "arrow"])
@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_copy_keeps_empty_strings_and_nulls_apart_with_both_drivers(
    postgres_url: str, driver: str, arrow: bool
) -> None:
    url = postgres_url.replace("postgresql+psycopg2://", f"postgresql+{driver}://")
    load_and_compare(url, "copy", 3, arrow=arrow)
