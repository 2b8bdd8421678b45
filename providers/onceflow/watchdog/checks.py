"""The checks: each reads stored evidence and says which state it calls for (a :class:`Verdict`).

Every check judges from times stored outside the watchdog (a heartbeat's start, a partition's
deadline, a row's first sighting), evaluated at the injected ``now``, never from when the
watchdog itself started: a restarted watchdog reaches the same verdict as one that never stopped.
A check that cannot read its evidence raises; the runner turns that into a blindness incident.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.watchdog.incidents import DOWN, FAILING, LATE, UP, Verdict
from onceflow.watchdog.schema import heartbeats, seen

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.engine import Engine

    from onceflow.watchdog.config import CheckConfig
    from onceflow.watchdog.incidents import Incident

log = logging.getLogger(__name__)


def _iso(ts: float | None) -> str | None:
    return (
        None if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")
    )


def _staged(due: float, grace: float, now: float, ok: str, evidence: dict[str, Any], what: str) -> Verdict:
    """up until ``due``, late during the grace, down after it (``since`` = when it was due)."""
    if now <= due:
        return Verdict(UP, ok, evidence, since=None)
    state = LATE if now < due + grace else DOWN
    return Verdict(
        state, f"{what} (overdue since {_iso(due)})", evidence, since=due if state == LATE else due + grace
    )


def heartbeat(check: CheckConfig, ledger: Engine, now: float, incident: Incident) -> Verdict:
    """The newest beat must be younger than the period; its start lag below ``max_lag``."""
    query = sa.select(heartbeats).order_by(heartbeats.c.started_at.desc()).limit(5)
    if check.options.get("dag_id"):
        query = query.where(heartbeats.c.dag_id == check.options["dag_id"])
    with ledger.connect() as conn:
        rows = conn.execute(query).all()
    if not rows:
        # Never beaten: count from when the watchdog first watched this check (stored).
        evidence: dict[str, Any] = {"last_beat": None, "watched_since": _iso(incident.created_at)}
        return _staged(
            incident.created_at + check.period, check.grace, now, "", evidence, "no heartbeat ever recorded"
        )
    last = rows[0]._mapping
    evidence = {
        "last_beat_run_id": last["run_id"],
        "last_beat_scheduled": _iso(last["scheduled_at"]),
        "last_beat_started": _iso(last["started_at"]),
        "last_beat_lag_s": round(last["lag_seconds"], 1),
        "seconds_since_last_beat": round(now - last["started_at"], 1),
        "recent_lags_s": [round(r.lag_seconds, 1) for r in rows],
    }
    verdict = _staged(
        last["started_at"] + check.period,
        check.grace,
        now,
        f"last beat {now - last['started_at']:.0f} s ago",
        evidence,
        f"no heartbeat for {now - last['started_at']:.0f} s (period {check.period:.0f} s)",
    )
    if verdict.state == UP and last["lag_seconds"] > check.options["max_lag"]:
        # Alive but slow: the scheduler started the beat late. Shows before a dead one does.
        return Verdict(
            LATE,
            f"scheduler slow: last beat started {last['lag_seconds']:.0f} s after its scheduled time "
            f"(max {check.options['max_lag']:.0f} s)",
            evidence,
            since=last["started_at"],
        )
    return verdict


def api_health(check: CheckConfig, now: float, fetch: Callable[[str, float], Any] | None = None) -> Verdict:
    """Airflow's ``/api/v2/monitor/health``. Recorded, never trusted alone: it reads the metadata
    database, and has said "healthy" while a scheduler was stuck (see ``docs/watchdog.md``)."""
    url = check.options["url"]
    try:
        body = (fetch or _get_json)(url, check.options["timeout"])
    except Exception as exc:
        return Verdict(FAILING, f"api-server health endpoint failed: {exc}", {"url": url})
    if not isinstance(body, dict):  # a proxy's page or a wrong URL: the api-server is not answering
        return Verdict(FAILING, f"api-server health endpoint answered {body!r:.200}", {"url": url})
    unhealthy = {
        name: part.get("status")
        for name, part in body.items()
        if isinstance(part, dict) and part.get("status") not in ("healthy", None)
    }
    evidence = {"url": url, "health": body}
    if unhealthy:
        return Verdict(FAILING, f"api-server reports unhealthy: {unhealthy}", evidence)
    return Verdict(UP, "api-server reports healthy", evidence)


def _get_json(url: str, timeout: float) -> Any:
    from onceflow.watchdog.alerts import DeliveryError, http_request

    # A total deadline: an api-server dripping its answer must not hold the watchdog's pass.
    status, data = http_request("GET", url, None, {"Accept": "application/json"}, timeout)
    if not 200 <= status < 300:
        raise DeliveryError(f"{url} answered {status}")
    return json.loads(data)


def business_freshness(check: CheckConfig, warehouse: Engine, now: float) -> Verdict:
    """The table's ``load_audit`` partitions against the newest passed deadline.

    The deadline is a cron schedule in the business timezone (``0 7 * * *``: 07:00 local each
    day, whatever the UTC offset that day); at each deadline the partition
    ``partition_offset_days`` before the deadline's local date must be loaded. If several
    deadlines were missed, the verdict counts from the first one, so 60 hours of nothing is
    reported at the first missed deadline (plus grace), not later.
    """
    from onceflow.sales.table_names import resolve_table

    # The key the loads wrote: `public.daily_sales` and `daily_sales` are one table, one key.
    table = resolve_table(warehouse, check.options["table"]).fence_name
    fires = deadlines(check, now)
    newest_fire = first = next(fires)
    expected = expected_partition(check, newest_fire)
    with warehouse.connect() as conn:
        newest = conn.execute(
            sa.text("SELECT MAX(partition_key) FROM load_audit WHERE table_name = :t"), {"t": table}
        ).scalar()
        # The newest partition not after the expected one: a partition of a later day (today's,
        # loaded early, or a wrong date) must not stand in for a missing one when the table has
        # older ones. With none older (its first load was for a later day) nothing is missing.
        loaded = conn.execute(
            sa.text(
                "SELECT MAX(partition_key) FROM load_audit WHERE table_name = :t AND partition_key <= :e"
            ),
            {"t": table, "e": expected},
        ).scalar()
    evidence: dict[str, Any] = {"table": table, "newest_partition": newest, "expected_partition": expected}
    if (loaded is None and newest is not None) or str(loaded) == expected:
        return Verdict(UP, f"{table} {expected} loaded", evidence)
    # The first deadline whose partition is missing: walk back while the partition is still missing.
    for fire in fires:
        if loaded is not None and expected_partition(check, fire) <= str(loaded):
            break
        first = fire
    evidence["first_missed_deadline"] = first.isoformat()
    evidence["first_missing_partition"] = expected_partition(check, first)
    return _staged(
        first.timestamp(),
        check.grace,
        now,
        "",
        evidence,
        f"{table} partition {evidence['first_missing_partition']} not loaded by {first.isoformat()}",
    )


def deadlines(check: CheckConfig, now: float, count: int = 400) -> Iterator[dt.datetime]:
    """Up to ``count`` passed deadlines, newest first, as aware local datetimes (DST-correct)."""
    from croniter import croniter

    tz = check.options["timezone"]
    it = croniter(check.options["deadline_cron"], dt.datetime.fromtimestamp(now, tz))
    for _ in range(count):
        yield it.get_prev(dt.datetime).astimezone(tz)


def expected_partition(check: CheckConfig, fire: dt.datetime) -> str:
    """The partition that must be loaded by the deadline ``fire``."""
    return (fire.date() - dt.timedelta(days=check.options["partition_offset_days"])).isoformat()


def article_queue(check: CheckConfig, ledger: Engine, now: float) -> Verdict:
    """The oldest claimed article (ledger item ``article:*``) whose run has not finished."""
    with ledger.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT work_key, created_at, state FROM work_items WHERE kind = 'article' "
                "AND state IN ('pending', 'leased') ORDER BY created_at LIMIT 1"
            )
        ).first()
    if row is None:
        return Verdict(UP, "no claimed article waiting", {"oldest": None})
    age = now - row.created_at
    evidence = {"oldest_work_key": row.work_key, "claimed_at": _iso(row.created_at), "age_s": round(age, 1)}
    return _staged(
        row.created_at + check.options["max_age"],
        check.grace,
        now,
        f"oldest claimed article {age:.0f} s old",
        evidence,
        f"claimed article {row.work_key} unfinished for {age:.0f} s",
    )


def sheet_queue(check: CheckConfig, ledger: Engine, now: float, service: Any | None = None) -> Verdict:
    """The oldest NEW row of the sheet queue, by when the watchdog first saw it NEW.

    The sheet has no creation time per row, so the first sighting is stored (``watchdog_seen``,
    keyed by URL) and survives restarts; one ``values.get`` per evaluation.
    """
    from onceflow.sheets.model import normalise_header

    opts = check.options
    service = service or sheets_service(opts["endpoint"], opts["credentials_file"])
    values = (
        service.spreadsheets()
        .values()
        .get(spreadsheetId=opts["spreadsheet_id"], range=opts["range"])
        .execute(num_retries=0)
        .get("values", [])
    )
    header = [normalise_header(h) for h in values[0]] if values else []
    if "url" not in header or "status" not in header:
        raise ValueError(f"sheet range {opts['range']!r} has no url/status header: {header!r}")
    iu, ist = header.index("url"), header.index("status")
    new = {
        row[iu].strip()
        for row in values[1:]
        if len(row) > max(iu, ist) and row[iu].strip() and row[ist].strip().upper() == "NEW"
    }
    with ledger.begin() as conn:
        known = {
            r.item_key: r.first_seen
            for r in conn.execute(sa.select(seen).where(seen.c.check_name == check.name))
        }
        gone = set(known) - new
        if gone:
            conn.execute(seen.delete().where(seen.c.check_name == check.name, seen.c.item_key.in_(gone)))
        for key in new - set(known):
            conn.execute(seen.insert().values(check_name=check.name, item_key=key[:600], first_seen=now))
            known[key] = now
    if not new:
        return Verdict(UP, "no NEW row waiting", {"new_rows": 0})
    oldest_key = min(new, key=lambda k: known[k])
    first = known[oldest_key]
    evidence = {"new_rows": len(new), "oldest_url": oldest_key, "first_seen_new": _iso(first)}
    return _staged(
        first + opts["max_age"],
        check.grace,
        now,
        f"oldest NEW row waiting {now - first:.0f} s",
        evidence,
        f"NEW row {oldest_key} waiting {now - first:.0f} s (max {opts['max_age']:.0f} s)",
    )


def sheets_service(endpoint: str | None, credentials_file: str | None) -> Any:
    """A Sheets v4 client: a service account file in production, anonymous against an emulator."""
    from googleapiclient.discovery import build

    if credentials_file:
        from google.oauth2 import service_account

        creds = service_account.Credentials.from_service_account_file(
            credentials_file, scopes=["https://www.googleapis.com/auth/spreadsheets.readonly"]
        )
        options = {"api_endpoint": endpoint} if endpoint else None
        return build(
            "sheets",
            "v4",
            credentials=creds,
            client_options=options,
            cache_discovery=False,
            static_discovery=True,
        )
    from onceflow.sheets.transport import anonymous_service

    return anonymous_service(endpoint or "https://sheets.googleapis.com/")
