"""SalesDashboardOperator: render the finance dashboard from the warehouse into a folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from onceflow.sales.partitions import validate_table_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

#: Where the dashboard goes when no ``output_dir`` is given, relative to ``$AIRFLOW_HOME``.
DEFAULT_DASHBOARD_DIR = Path("onceflow") / "dashboard"


def default_dashboard_dir() -> Path:
    """``$AIRFLOW_HOME/onceflow/dashboard``, resolved when the task runs."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / DEFAULT_DASHBOARD_DIR


class SalesDashboardOperator(BaseOperator):
    """Render the last ``window_days`` days of a sales table as ``index.html`` plus a PNG chart.

    Reads ``load_audit`` and the sales table through :class:`~onceflow.hooks.warehouse.WarehouseHook`,
    renders with :func:`onceflow.sales.dashboard.render_dashboard` (the freshness line names the
    newest complete day; missing days are shown as not loaded) and publishes atomically.

    :param warehouse_conn_id: connection of the warehouse (PostgreSQL or SQLite).
    :param table: the sales table (templated); refused unless a plain identifier.
    :param output_dir: folder for the page and chart (templated); default
        ``$AIRFLOW_HOME/onceflow/dashboard``.
    :param title: page heading (templated).
    :param currency: the warehouse's reporting currency, for labels.
    :param window_days: calendar days shown, ending at the newest complete day.
    :return: (XCom) ``page``, ``newest_complete_day`` and ``missing_days``.
    """

    template_fields: Sequence[str] = ("table", "output_dir", "title")

    def __init__(
        self,
        *,
        warehouse_conn_id: str = "onceflow_warehouse",
        table: str = "daily_sales",
        output_dir: str | None = None,
        title: str = "Daily sales",
        currency: str = "EUR",
        window_days: int = 30,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if window_days < 1:
            raise ValueError(f"window_days must be at least 1, got {window_days}")
        self.warehouse_conn_id = warehouse_conn_id
        self.table = table
        self.output_dir = output_dir
        self.title = title
        self.currency = currency
        self.window_days = window_days

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.extras import require
        from onceflow.hooks.warehouse import WarehouseHook
        from onceflow.sales.dashboard import fetch_dashboard_rows, render_dashboard, write_dashboard

        require("dashboard")
        table = validate_table_name(self.table)
        hook = WarehouseHook(warehouse_conn_id=self.warehouse_conn_id)
        with hook.engine.connect() as conn:
            rows = fetch_dashboard_rows(conn, table=table, window_days=self.window_days)
        rendered = render_dashboard(
            rows, title=self.title, currency=self.currency, window_days=self.window_days
        )
        out_dir = Path(self.output_dir) if self.output_dir else default_dashboard_dir()
        page = write_dashboard(rendered, out_dir)
        newest = rendered.newest_complete_day
        if newest is None:
            self.log.warning("No partition of %s has been loaded; wrote the no-data page %s", table, page)
        else:
            self.log.info(
                "Dashboard %s: complete through %s, %d day(s) of the window not loaded",
                page,
                newest,
                len(rendered.missing_days),
            )
        return {
            "page": str(page),
            "newest_complete_day": newest.isoformat() if newest else None,
            "missing_days": [d.isoformat() for d in rendered.missing_days],
        }
