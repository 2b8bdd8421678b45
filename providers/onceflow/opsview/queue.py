"""The sheet queue (read from the sheet itself) and the published articles (from the ledger).

The sheet is where editors look, so its statuses are the truth the view shows: NEW,
PROCESSING, NEEDS_REVIEW (linked to the run's review), DONE, FAILED and INVALID by reason. A row
has no creation time, so "oldest NEW" is the watchdog's first sighting (``watchdog_seen``, kept
by its ``sheet_queue`` check) when the watchdog watches the sheet, and unknown otherwise. One
``values.batchGet`` per :data:`SHEET_CACHE_S` at most, however often the page is refreshed: the
view must not eat the claimers' Sheets quota.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger import schema
from onceflow.opsview.links import TaskRef, from_owner
from onceflow.sheets.model import Snapshot, Status

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Connection

ARTICLE_DAG = "article_pipeline"
REVIEW_TASK = "review"
SHEET_CACHE_S = 15.0
LISTED = 100

_cache: dict[str, tuple[float, list[list[Any]]]] = {}
_cache_lock = threading.Lock()


def read_sheet(now: float | None = None) -> list[list[Any]]:
    """The queue tab's values through connection ``onceflow_sheets``, cached for SHEET_CACHE_S."""
    from onceflow.hooks.sheets import SheetQueueHook

    hook = SheetQueueHook()
    key = f"{hook.spreadsheet_id}/{hook.sheet}"
    now = time.monotonic() if now is None else now
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < SHEET_CACHE_S:
            return hit[1]
    values = hook.transport().read([hook.sheet])[0]
    with _cache_lock:
        _cache[key] = (now, values)
    return values


def clear_cache() -> None:
    """Forget the cached sheet reads."""
    with _cache_lock:
        _cache.clear()


def sheet_queue(values: list[list[Any]], first_seen: dict[str, float], now: float) -> dict[str, Any]:
    """Summarise the queue tab's ``values`` (header first).

    :param first_seen: URL -> when the watchdog first saw the row NEW.
    """
    snapshot = Snapshot.from_values(values)
    counts: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {Status.FAILED.value: Counter(), Status.INVALID.value: Counter()}
    review: list[dict[str, Any]] = []
    processing: list[dict[str, Any]] = []
    new_rows: list[dict[str, Any]] = []
    for row in snapshot.rows:
        if not row.url.strip() and not row.status_cell.raw.strip():
            continue  # an empty line
        status = row.status.value if row.status is not None else (row.status_cell.raw.strip() or "(blank)")
        counts[status] += 1
        if status in reasons:
            reasons[status][row.get("reason") or "(no reason)"] += 1
        run_id = row.get("run_id").strip()
        # A row claimed but whose run is not created yet (claim first, then the run) has no run
        # id: its links are None, never missing (the page's template is strict).
        entry: dict[str, Any] = {"row": row.number, "url": row.url, "run_id": run_id or None, "run_url": None}
        if row.status is Status.NEEDS_REVIEW:
            entry["review_url"] = None
        if run_id:
            ref = TaskRef(ARTICLE_DAG, run_id)
            entry["run_url"] = ref.run_url
            if row.status is Status.NEEDS_REVIEW:
                entry["review_url"] = ref.review_url(REVIEW_TASK)
        if row.status is Status.NEEDS_REVIEW:
            review.append({**entry, "score": row.get("score"), "reason": row.get("reason")})
        elif row.status is Status.PROCESSING:
            processing.append(entry)
        elif row.status is Status.NEW:
            seen = first_seen.get(row.url.strip())
            new_rows.append(
                {**entry, "first_seen": seen, "age_s": None if seen is None else max(0.0, now - seen)}
            )
    aged = [r for r in new_rows if r["age_s"] is not None]
    oldest = max(aged, key=lambda r: r["age_s"]) if aged else None
    return {
        "counts": dict(sorted(counts.items())),
        "by_reason": {s: [{"reason": k, "rows": n} for k, n in c.most_common()] for s, c in reasons.items()},
        "needs_review": review[:LISTED],
        "processing": processing[:LISTED],
        "new": new_rows[:LISTED],
        "oldest_new": oldest,
        "oldest_new_known": bool(aged) or not new_rows,
    }


def watchdog_first_seen(conn: Connection) -> dict[str, float]:
    """URL -> the earliest first sighting of the row NEW by any watchdog check (empty without one)."""
    if not sa.inspect(conn).has_table("watchdog_seen"):
        return {}
    rows = conn.execute(sa.text("SELECT item_key, MIN(first_seen) FROM watchdog_seen GROUP BY item_key"))
    return {key: float(at) for key, at in rows}


def load_sheet_queue(
    conn: Connection, now: float, read: Callable[[], list[list[Any]]] = read_sheet
) -> dict[str, Any]:
    """:func:`sheet_queue` on a fresh (or cached) read; an unreadable sheet is an error entry."""
    try:
        values = read()
    except Exception as exc:  # the page shows why, the other sections still render
        return {"error": f"{type(exc).__name__}: {exc}"}
    return sheet_queue(values, watchdog_first_seen(conn), now)


def published_articles(conn: Connection, now: float, limit: int = 50) -> dict[str, Any]:
    """The newest published articles: link, source, version, when, by which run, written back or not."""
    r, w = schema.results, schema.work_items
    wb = r.alias("wb")
    rows = conn.execute(
        sa.select(
            r.c.work_key,
            r.c.processing_version,
            r.c.payload,
            r.c.committed_at,
            r.c.committed_by,
            w.c.payload.label("item_payload"),
            wb.c.payload.label("written"),
            wb.c.committed_by.label("written_by"),
        )
        .select_from(
            r.outerjoin(w, w.c.work_key == r.c.work_key).outerjoin(
                wb,
                sa.and_(
                    wb.c.work_key == r.c.work_key,
                    wb.c.step == "write_back",
                    wb.c.processing_version == r.c.processing_version,
                ),
            )
        )
        .where(r.c.step == "publish")
        .order_by(r.c.committed_at.desc())
        .limit(limit)
    )
    articles = []
    for row in rows:
        published = _json(row.payload)
        item = _json(row.item_payload)
        ref = from_owner(row.committed_by)
        written_ref = from_owner(row.written_by)
        articles.append(
            {
                "work_key": row.work_key,
                "processing_version": row.processing_version,
                "published_url": published.get("url"),
                "source_url": item.get("url"),
                "score": published.get("score"),
                "published_at": row.committed_at,
                "age_s": max(0.0, now - row.committed_at),
                "written_back": row.written is not None,
                "run": None if ref is None else ref.as_dict(),
                "write_back_run": None if written_ref is None else written_ref.as_dict(),
            }
        )
    return {"articles": articles}


def _json(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
