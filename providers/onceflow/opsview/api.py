"""The view's FastAPI app, mounted by the plugin under :data:`PREFIX` in the api-server.

``GET /api/v1/<section>`` returns one section's document (:mod:`onceflow.opsview.documents`);
``GET /`` is the page; ``GET /dashboard/<file>`` serves the sales dashboard ``sales_dashboard``
wrote; ``GET /metrics`` is OpenMetrics text. Every route checks access first
(:mod:`onceflow.opsview.access`): no data leaves before the auth manager said yes.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from airflow.api_fastapi.core_api.security import GetUserDep, resolve_user_from_token
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from onceflow.opsview import access, documents, metrics, page, sources

PREFIX = "/onceflow-ops"
#: The page runs no script at all; styles are inline; it may be framed only by Airflow's own UI.
PAGE_CSP = (
    "default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "frame-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
_bearer = HTTPBearer(auto_error=False)

app = FastAPI(
    title="onceflow operations view",
    description="Is the business process progressing? The ledger's six questions, partitions, the "
    "sheet queue, published articles and the watchdog. Auth: Airflow's auth manager.",
    # no schema or docs routes: FastAPI would serve them to anyone, past the auth manager
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


def _require(user: Any, section: access.Section) -> None:
    if not access.may_read(user, section):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"Forbidden: no read access to {section.name}")


def _unavailable(what: str, exc: Exception) -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE, f"{what} unavailable: {type(exc).__name__}: {exc}"
    )


def build(section: access.Section, now: float, settings: sources.Settings) -> dict[str, Any]:
    """One section's document from the configured sources."""
    if section is access.QUESTIONS:
        return documents.questions_doc(sources.ledger_engine(), now)
    if section is access.PARTITIONS:
        return documents.partitions_doc(sources.warehouse_engine(), now, settings)
    if section is access.QUEUE:
        return documents.queue_doc(sources.ledger_engine(), now)
    if section is access.ARTICLES:
        return documents.articles_doc(sources.ledger_engine(), now)
    if section is access.WATCHDOG:
        return documents.watchdog_doc(sources.ledger_engine(), now, settings)
    if section is access.DASHBOARD:
        return documents.dashboard_doc(now)
    raise KeyError(section.name)


def _section_route(section: access.Section) -> None:
    def endpoint(user: GetUserDep) -> JSONResponse:
        _require(user, section)
        try:
            doc = build(section, time.time(), sources.Settings.from_airflow())
        except Exception as exc:
            raise _unavailable(section.name, exc) from exc
        return JSONResponse(doc, headers={"Cache-Control": "no-store"})

    endpoint.__name__ = f"get_{section.name}"
    app.add_api_route(f"/api/v1/{section.name}", endpoint, methods=["GET"], name=section.name)


for _section in access.SECTIONS:
    _section_route(_section)


@app.get("/", response_class=HTMLResponse)
def ops_page(user: GetUserDep) -> HTMLResponse:
    """The page: every section the user may read, rendered on the server (nothing fetched later)."""
    allowed = [s for s in access.SECTIONS if access.may_read(user, s)]
    if not allowed:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: no read access to any section")
    now = time.time()
    docs: dict[str, Any] = {}
    for section in access.SECTIONS:
        if section not in allowed:
            docs[section.name] = {"forbidden": True}
            continue
        try:  # a bad [onceflow_ops] setting is shown in every section, not a bare 500
            docs[section.name] = build(section, now, sources.Settings.from_airflow())
        except Exception as exc:  # one unreachable source does not blank the page
            docs[section.name] = {"error": f"{type(exc).__name__}: {exc}"}
    return HTMLResponse(
        page.render(docs, now), headers={"Cache-Control": "no-store", "Content-Security-Policy": PAGE_CSP}
    )


@app.get("/dashboard/{name}")
def dashboard_file(name: str, user: GetUserDep) -> FileResponse:
    """A file of the sales dashboard (``index.html`` and its chart), never a path outside it."""
    _require(user, access.DASHBOARD)
    directory = documents.dashboard_dir().resolve()
    path = (directory / name).resolve()
    if path.parent != directory or not path.is_file() or path.suffix not in (".html", ".png"):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such dashboard file")
    # the dashboard's own HTML is rendered by sales_dashboard from warehouse data: no scripts run
    return FileResponse(
        path, headers={"Content-Security-Policy": "script-src 'none'", "Cache-Control": "no-store"}
    )


async def metrics_access(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """The configured scrape token, or an Airflow user who may read every DAG."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    presented = credentials.credentials if credentials and credentials.scheme.lower() == "bearer" else None
    if access.token_matches(presented, sources.Settings.from_airflow().metrics_token):
        return
    user = await resolve_user_from_token(presented or request.cookies.get(COOKIE_NAME_JWT_TOKEN))
    _require(user, access.METRICS)


@app.get("/metrics", dependencies=[Depends(metrics_access)])
def metrics_text() -> PlainTextResponse:
    """The operations view's figures in the OpenMetrics text format (for Prometheus)."""
    try:
        doc = documents.questions_doc(sources.ledger_engine(), time.time())
    except Exception as exc:
        raise _unavailable("ledger", exc) from exc
    return PlainTextResponse(metrics.openmetrics(doc), media_type=metrics.CONTENT_TYPE)
