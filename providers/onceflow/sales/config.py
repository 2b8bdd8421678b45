"""Settings of the daily_sales DAG, read from the environment (cheap, at DAG parse time).

| variable | default | meaning |
|---|---|---|
| ``ONCEFLOW_BUSINESS_TZ`` | ``Europe/Amsterdam`` | timezone whose midnights bound each day |
| ``ONCEFLOW_SALES_TABLE`` | ``daily_sales`` | warehouse table (identifier, validated) |
| ``ONCEFLOW_SALES_START_DATE`` | ``2023-01-01`` | first local day the DAG knows about |
| ``ONCEFLOW_SALES_MAX_REJECT_RATIO`` | ``0.05`` | the load fails above this share of rejected rows (0 to 1) |
| ``ONCEFLOW_REPORTING_CURRENCY`` | ``EUR`` | currency of the warehouse amounts |
| ``ONCEFLOW_SALES_RETRIES`` | ``2`` | task retries (tests that expect failure set 0) |
| ``ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES`` | ``120`` | ``execution_timeout`` of each task (then it fails and retries; at least 1/60) |
| ``ONCEFLOW_SALES_STAGING_DIR`` | ``<onceflow_storage base>/sales-staging`` | files between tasks |
| ``ONCEFLOW_SALES_TEXT_ROWS`` | ``10000`` | days up to this size are staged as text (0: parquet always) |

``ONCEFLOW_SALES_STAGING_DIR`` and ``ONCEFLOW_SALES_TEXT_ROWS`` are the exceptions, read by the tasks
when they run (:func:`onceflow.sales.text_staging.text_rows_limit`). The extract task reads the staging
directory (not the parse), through
:func:`onceflow.sales.staging.base_uri`. It overrides where the staging goes: an absolute path, a
``file:///abs/path`` or a ``gs://bucket/prefix`` URI (anything else fails the extract, naming the
variable). Unset, the staging goes through connection ``onceflow_storage``, under its ``base``
(``$AIRFLOW_HOME/onceflow/storage/sales-staging`` without the connection; the bucket for
``gs://``), so workers on several hosts need no shared disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Asset

import dataclasses
import datetime as dt
import math
import os
from zoneinfo import ZoneInfo

from onceflow.sales.partitions import validate_table_name

#: the longest task timeout accepted, in minutes (about 1,900 years; ``timedelta`` ends near 2.7 million).
_MAX_TIMEOUT_MINUTES = 1e9


@dataclasses.dataclass(frozen=True)
class SalesConfig:
    """``daily_sales``' settings; ``from_env`` reads the ``ONCEFLOW_*`` variables of the module's table."""

    timezone: str = "Europe/Amsterdam"
    table: str = "daily_sales"
    start_date: dt.date = dt.date(2023, 1, 1)
    max_reject_ratio: float = 0.05
    reporting_currency: str = "EUR"
    retries: int = 2
    task_timeout_minutes: float = 120

    @classmethod
    def from_env(cls) -> SalesConfig:
        """Read and validate the settings from the environment (defaults for the unset ones)."""
        env = os.environ
        config = cls(
            timezone=env.get("ONCEFLOW_BUSINESS_TZ", cls.timezone),
            table=env.get("ONCEFLOW_SALES_TABLE", cls.table),
            start_date=dt.date.fromisoformat(
                env.get("ONCEFLOW_SALES_START_DATE", cls.start_date.isoformat())
            ),
            max_reject_ratio=float(env.get("ONCEFLOW_SALES_MAX_REJECT_RATIO", cls.max_reject_ratio)),
            reporting_currency=env.get("ONCEFLOW_REPORTING_CURRENCY", cls.reporting_currency),
            retries=int(env.get("ONCEFLOW_SALES_RETRIES", cls.retries)),
            task_timeout_minutes=float(
                env.get("ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES", cls.task_timeout_minutes)
            ),
        )
        minutes = config.task_timeout_minutes
        # "nan" and "inf" parse as floats; a timeout that rounds to timedelta(0) is none at all to
        # Airflow ("if task.execution_timeout:"), so at least a second.
        if not (math.isfinite(minutes) and 1 / 60 <= minutes <= _MAX_TIMEOUT_MINUTES):
            raise ValueError(
                "ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES must be positive: every task needs a deadline "
                f"(a number of minutes from 1/60 to {_MAX_TIMEOUT_MINUTES:g}), got {minutes!r}"
            )
        ratio = config.max_reject_ratio
        if not 0 <= ratio <= 1:  # also "nan", which no ratio is ever above: the check never failed
            raise ValueError(
                f"ONCEFLOW_SALES_MAX_REJECT_RATIO must be a share from 0 to 1 (0.05 = 5 %), got {ratio!r}"
            )
        validate_table_name(config.table)
        ZoneInfo(config.timezone)  # fails loudly on a typo
        return config

    @property
    def task_timeout(self) -> dt.timedelta:
        """``execution_timeout`` of each daily_sales task."""
        return dt.timedelta(minutes=self.task_timeout_minutes)

    def asset(self) -> Asset:
        """The Asset of the loaded table: daily_sales' load emits it, sales_dashboard is scheduled on it."""
        from airflow.sdk import Asset

        return Asset(name=f"onceflow.warehouse.{self.table}", uri=self.asset_uri)

    @property
    def asset_uri(self) -> str:
        """URI of the Asset the load updates (``sales_dashboard`` is scheduled on it)."""
        # The "x-" scheme marks a private URI: Airflow then skips loading every provider's
        # URI normalizers, which would add ~4 s to each cold parse of the DAG files.
        return f"x-onceflow://warehouse/{self.table}"
