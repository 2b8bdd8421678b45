"""Who may read what: every endpoint of the view asks Airflow's auth manager, as the core API does.

Airflow does not protect a plugin's FastAPI app by itself. Each endpoint here depends on
Airflow's own :data:`~airflow.api_fastapi.core_api.security.GetUserDep` (the JWT from the
``Authorization: Bearer`` header or the UI's ``_token`` cookie: missing is 401, invalid 403) and
then on the auth manager's decision for the DAG (and Asset) whose records the section shows,
with the same method and entity the core API checks for those records (DAG runs, ``GET``).
Figures that span every DAG (the ledger's six questions, the metrics) need read access to all
DAGs (``DagDetails(id=None)``). The DAG ids are fixed here, never taken from the request: the
core helper ``requires_access_dag`` falls back to a ``dag_id`` query parameter, which would let
a caller choose which DAG is checked.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser


@dataclass(frozen=True)
class Section:
    """A part of the view and the Airflow resources its records belong to."""

    name: str
    dag_id: str | None  # None: every DAG
    asset: bool = False


QUESTIONS = Section("questions", None)
PARTITIONS = Section("partitions", "daily_sales", asset=True)
QUEUE = Section("queue", "article_pipeline")
ARTICLES = Section("articles", "article_pipeline")
WATCHDOG = Section("watchdog", "heartbeat")
DASHBOARD = Section("dashboard", "sales_dashboard", asset=True)
METRICS = Section("metrics", None)
SECTIONS = (QUESTIONS, PARTITIONS, QUEUE, ARTICLES, WATCHDOG, DASHBOARD)


def may_read(user: BaseUser, section: Section) -> bool:
    """The auth manager's answer for ``user`` reading ``section``'s records."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        AssetDetails,
        DagAccessEntity,
        DagDetails,
    )
    from airflow.models.dag import DagModel

    manager = get_auth_manager()
    team = DagModel.get_team_name(section.dag_id) if section.dag_id else None
    if not manager.is_authorized_dag(
        method="GET",
        access_entity=DagAccessEntity.RUN,
        details=DagDetails(id=section.dag_id, team_name=team),
        user=user,
    ):
        return False
    return not section.asset or manager.is_authorized_asset(method="GET", details=AssetDetails(), user=user)


def token_matches(presented: str | None, configured: str) -> bool:
    """A constant-time comparison of the metrics token (never true when none is configured)."""
    if not configured or presented is None:
        return False
    # as bytes: compare_digest raises on a str with non-ASCII characters (a header may carry any)
    return hmac.compare_digest(presented.encode(), configured.encode())
