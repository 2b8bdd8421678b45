"""``load_audit``: one row per partition, describing the load that the partition holds.

Written in the overwrite's transaction (so it exists if and only if the partition holds that
load) and read by the dashboard, the reconciler and anyone asking "is Saturday loaded?".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


@dataclasses.dataclass(frozen=True)
class AuditRecord:
    """One ``load_audit`` row: the last committed load of one partition."""

    table_name: str
    partition_key: str
    row_count: int
    reject_count: int
    checksum: str
    run_id: str
    try_number: int
    #: the partition's fence token (``load_fence``) the load held.
    fence_token: int
    processing_version: str
    loaded_at_utc: dt.datetime
    #: the work ledger's token of a ledger-fenced load; None for a warehouse-lease load.
    ledger_token: int | None = None
    #: when the loaded extract read the shop (the shop database's clock); None if unknown.
    source_watermark_utc: dt.datetime | None = None
    #: exact repeats dropped by cleaning (latest wins); None if the staged files did not say.
    duplicate_count: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> AuditRecord:
        """Build from a ``load_audit`` row."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row._asdict().items() if k in fields})


def describe_watermark(value: dt.datetime | None) -> str:
    """A watermark for a message (``an unknown time`` when there is none)."""
    return "an unknown time" if value is None else f"{value.isoformat(sep=' ')} UTC"


def replace_audit(conn: Connection, audit_table: sa.Table, audit: AuditRecord) -> None:
    """Make ``audit`` the partition's only audit row."""
    at = audit_table
    conn.execute(
        at.delete().where(at.c.table_name == audit.table_name, at.c.partition_key == audit.partition_key)
    )
    conn.execute(at.insert().values(**dataclasses.asdict(audit)))


def read_audit(conn: Connection, audit_table: sa.Table, table_name: str, key: str) -> AuditRecord | None:
    """The ``load_audit`` row of one table's partition, or ``None``."""
    at = audit_table
    row = conn.execute(
        sa.select(at).where(at.c.table_name == table_name, at.c.partition_key == key)
    ).one_or_none()
    return None if row is None else AuditRecord.from_row(row)
