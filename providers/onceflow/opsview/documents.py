"""Each section of the view as one JSON-ready document: what the API returns and the page renders.

Every builder takes the engine(s) and ``now``; :mod:`onceflow.opsview.api` passes the configured
ones and the wall clock, tests and the benchmark their own.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.opsview import partitions, questions, queue, watchdog
from onceflow.opsview.sources import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Engine


def questions_doc(ledger: Engine, now: float) -> dict[str, Any]:
    """The answers to the operations view's questions, read from the ledger."""
    with ledger.connect() as conn:
        return questions.all_questions(conn, now)


def partitions_doc(warehouse: Engine, now: float, settings: Settings) -> dict[str, Any]:
    """The warehouse's partitions per table: loaded, missing and late days."""
    from onceflow.sales.config import SalesConfig

    config = SalesConfig.from_env()
    tables = []
    with warehouse.connect() as conn:
        for table in settings.tables:
            try:
                tables.append(
                    partitions.calendar(
                        conn,
                        table,
                        now,
                        days=settings.calendar_days,
                        timezone=config.timezone,
                        first_day=config.start_date,
                    )
                )
            except Exception as exc:  # one broken table does not hide the others
                conn.rollback()
                tables.append({"table": table, "error": f"{type(exc).__name__}: {exc}"})
    return {"now": now, "tables": tables}


def queue_doc(
    ledger: Engine, now: float, read: Callable[[], list[list[Any]]] = queue.read_sheet
) -> dict[str, Any]:
    """The Sheet queue as the ledger and the sheet show it."""
    with ledger.connect() as conn:
        return {"now": now, **queue.load_sheet_queue(conn, now, read)}


def articles_doc(ledger: Engine, now: float) -> dict[str, Any]:
    """The published articles and their links."""
    with ledger.connect() as conn:
        return {"now": now, **queue.published_articles(conn, now)}


def watchdog_doc(ledger: Engine, now: float, settings: Settings) -> dict[str, Any]:
    """The watchdog's incidents and alerts."""
    with ledger.connect() as conn:
        return {"now": now, **watchdog.watchdog_state(conn, now, settings.watchdog_status_url)}


def dashboard_dir() -> Path:
    """Where ``sales_dashboard`` writes (``ONCEFLOW_DASHBOARD_DIR``, else under AIRFLOW_HOME)."""
    import os

    from onceflow.operators.dashboard import default_dashboard_dir

    configured = os.environ.get("ONCEFLOW_DASHBOARD_DIR")
    return Path(configured) if configured else Path(default_dashboard_dir())


def dashboard_doc(now: float, directory: Path | None = None) -> dict[str, Any]:
    """Whether the finance dashboard exists and when it was drawn."""
    directory = directory or dashboard_dir()
    page = directory / "index.html"
    if not page.is_file():
        return {"now": now, "available": False, "directory": str(directory)}
    mtime = page.stat().st_mtime
    return {
        "now": now,
        "available": True,
        "rendered_at": dt.datetime.fromtimestamp(mtime, dt.timezone.utc).isoformat(),
        "age_s": max(0.0, now - mtime),
        "url": "dashboard/index.html",
    }
