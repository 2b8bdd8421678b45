"""The partition calendar: one cell a day per watched warehouse table, from ``load_audit``.

A day is *loaded* when ``load_audit`` holds its row (written in the overwrite's own transaction,
so it exists exactly when the partition holds that load). A day without one is *missing* once its
deadline has passed (07:00 business time on the next day, the same rule as ``daily_sales``'
Deadline Alert) and *due* before that. The calendar ends at the newest day whose deadline is
today's or earlier: yesterday, local time.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import sqlalchemy as sa

from onceflow.opsview.links import PARTITION_LOAD_TASK, TaskRef
from onceflow.sales.partitions import partition_key, validate_table_name
from onceflow.sales.schema import warehouse_tables

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

DAILY_SALES_DAG = "daily_sales"
DUE = dt.time(7, 0)

LOADED, MISSING, DUE_STATE = "loaded", "missing", "due"


def business_due(day: dt.date, timezone: str, due: dt.time = DUE) -> dt.datetime:
    """When ``day``'s partition is due: ``due`` local time on the next day, in UTC."""
    from onceflow.notifications.deadline_reference import business_due as due_at

    return due_at(day, timezone, due)


def calendar(
    conn: Connection,
    table: str,
    now: float,
    *,
    days: int,
    timezone: str,
    first_day: dt.date | None = None,
) -> dict[str, Any]:
    """The last ``days`` days of ``table`` up to yesterday (business time), oldest first.

    :param first_day: no cell before it (the DAG's start date).
    """
    validate_table_name(table)
    from onceflow.sales.table_names import resolve_table

    table = resolve_table(conn.engine, table).fence_name  # the key the loads wrote (one per table)
    now_utc = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    today = now_utc.astimezone(ZoneInfo(timezone)).date()
    last = today - dt.timedelta(days=1)
    start = last - dt.timedelta(days=days - 1)
    if first_day is not None and first_day > start:
        start = first_day
    audit = warehouse_tables(sa.MetaData()).audit
    rows = {
        row.partition_key: row
        for row in conn.execute(
            sa.select(audit).where(
                audit.c.table_name == table,
                audit.c.partition_key >= partition_key(start),
                audit.c.partition_key <= partition_key(last),
            )
        )
    }
    cells = []
    day = start
    while day <= last:
        key = partition_key(day)
        due_at = business_due(day, timezone)
        row = rows.get(key)
        cell: dict[str, Any] = {"day": key, "due_at": due_at.isoformat()}
        if row is not None:
            ref = TaskRef(DAILY_SALES_DAG, row.run_id, int(row.try_number), PARTITION_LOAD_TASK)
            loaded_at = row.loaded_at_utc
            cell.update(
                state=LOADED,
                rows=int(row.row_count),
                rejects=int(row.reject_count),
                checksum=row.checksum,
                loaded_at=None
                if loaded_at is None
                else loaded_at.replace(tzinfo=dt.timezone.utc).isoformat(),
                processing_version=row.processing_version,
                **{
                    k: v
                    for k, v in ref.as_dict().items()
                    if k in ("run_id", "try_number", "run_url", "log_url")
                },
            )
        else:
            cell["state"] = MISSING if due_at <= now_utc else DUE_STATE
        cells.append(cell)
        day += dt.timedelta(days=1)
    todays_due = business_due(last, timezone)
    return {
        "table": table,
        "timezone": timezone,
        "first_day": partition_key(start) if start <= last else None,
        "last_day": partition_key(last),
        "todays_deadline": todays_due.isoformat(),
        "todays_deadline_passed": todays_due <= now_utc,
        "cells": cells,
        "loaded": sum(c["state"] == LOADED for c in cells),
        "missing": [c["day"] for c in cells if c["state"] == MISSING],
    }
