"""``OnceflowOpsViewPlugin``: the operations view in the api-server and in Airflow's navigation.

Airflow imports every ``airflow.plugins`` entry point in every process (scheduler, workers, task
processes), and only the api-server mounts ``fastapi_apps``. So this module imports nothing heavy:
the FastAPI app (and with it Airflow's API security module) is imported when the api-server
iterates ``fastapi_apps``, through :class:`_MountedApps`. That is also where the metrics emitter
starts, when Airflow's StatsD or OpenTelemetry metrics are on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, overload

from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger(__name__)

PREFIX = "/onceflow-ops"
NAME = "onceflow operations"


class _MountedApps(Sequence[dict[str, Any]]):
    """``fastapi_apps`` as a sequence that builds its one entry on first access."""

    _apps: list[dict[str, Any]] | None = None

    def _load(self) -> list[dict[str, Any]]:
        if self._apps is None:
            from onceflow.opsview.api import app

            _start_stats_emitter()
            self._apps = [{"app": app, "url_prefix": PREFIX, "name": NAME}]
        return self._apps

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._load()[index]

    def __len__(self) -> int:
        return 1


_emitter: Any = None


def _start_stats_emitter() -> None:
    """Send the gauges through Airflow's Stats every ``[onceflow_ops] stats_interval`` seconds."""
    global _emitter
    try:
        from airflow.configuration import conf

        from onceflow.opsview import documents, metrics, sources

        interval = conf.getfloat("onceflow_ops", "stats_interval", fallback=metrics.STATS_INTERVAL_S)
        if _emitter is not None or interval <= 0 or not metrics.metrics_backend_on():
            return
        import time

        _emitter = metrics.StatsEmitter(
            lambda: documents.questions_doc(sources.ledger_engine(), time.time()), interval
        ).start()
    except Exception:  # metrics must never keep the api-server from starting
        log.warning("onceflow operations view: metrics emitter not started", exc_info=True)


class OnceflowOpsViewPlugin(AirflowPlugin):
    """The operations view: ``/onceflow-ops/`` (page, JSON API, metrics) and a "Browse" entry."""

    name = "onceflow_ops_view"
    fastapi_apps = _MountedApps()  # type: ignore[assignment]
    external_views = [
        {
            "name": "onceflow operations",
            "href": f"{PREFIX}/",
            "url_route": "onceflow-ops",
            "destination": "nav",
            "category": "browse",
        }
    ]
