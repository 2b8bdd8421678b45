"""The watchdog's checks and incidents: from its status API when one is configured, else from the
tables it keeps in the ledger database (``watchdog_incidents``, ``watchdog_alerts``,
``onceflow_heartbeats``; :mod:`onceflow.watchdog.schema`).

The tables are the default because they need nothing running: the watchdog runs outside Airflow,
and the view must still say what it last recorded when it is down. The status endpoint (the
watchdog's loopback HTTP server, ``[onceflow_ops] watchdog_status_url``) is read with a short
timeout; when it does not answer, the view falls back to the tables and says so.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.watchdog import schema as wd

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

STATUS_TIMEOUT_S = 2.0
RECENT_ALERTS = 20


def from_tables(conn: Connection, now: float) -> dict[str, Any]:
    """Incident states, recent alerts and the newest heartbeat as the watchdog recorded them."""
    inspector = sa.inspect(conn)
    if not inspector.has_table(wd.incidents.name):
        return {
            "source": "ledger",
            "checks": [],
            "alerts": [],
            "note": "the watchdog has not run against this database",
        }
    i = wd.incidents
    checks = [
        {
            "name": row.check_name,
            "state": row.state,
            "since": row.since,
            "for_s": max(0.0, now - row.since),
            "incident": row.incident,
            "alerted": bool(row.alerted),
            "reason": row.reason,
            "updated_at": row.updated_at,
        }
        for row in conn.execute(sa.select(i).order_by(i.c.check_name))
    ]
    alerts: list[dict[str, Any]] = []
    if inspector.has_table(wd.alerts.name):
        a = wd.alerts
        alerts = [
            {
                "check": row.check_name,
                "incident": row.incident,
                "kind": row.kind,
                "channel": row.channel,
                "state": row.state,
                "created_at": row.created_at,
                "sent_at": row.sent_at,
            }
            for row in conn.execute(
                sa.select(a).order_by(a.c.created_at.desc(), a.c.id.desc()).limit(RECENT_ALERTS)
            )
        ]
    beat = None
    if inspector.has_table(wd.heartbeats.name):
        beat = conn.execute(sa.select(sa.func.max(wd.heartbeats.c.started_at))).scalar()
    return {
        "source": "ledger",
        "checks": checks,
        "alerts": alerts,
        "last_heartbeat_at": beat,
        "seconds_since_heartbeat": None if beat is None else max(0.0, now - beat),
    }


def from_status_api(url: str, now: float) -> dict[str, Any]:
    """The watchdog's own status document (:mod:`onceflow.watchdog.status`), as it says it.

    Its checks (``{name: {...}}``) become a list as the tables give them; its blindness entries
    (``watchdog.blind.*``: the watchdog cannot see a store) are listed as checks too, since a
    blind watchdog is the incident an operator must see first. A 503 (its ledger unreadable)
    still carries the document.
    """
    try:
        with urllib.request.urlopen(url, timeout=STATUS_TIMEOUT_S) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as err:
        if err.code != 503:
            raise
        raw = err.read()
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError(f"watchdog status at {url} is not a JSON object")
    checks: list[dict[str, Any]] = []
    last_beat = None
    for group in ("blind", "checks"):
        entries = doc.get(group) or {}
        for name, raw_entry in sorted(entries.items() if isinstance(entries, dict) else []):
            entry = raw_entry if isinstance(raw_entry, dict) else {"state": raw_entry}
            since = entry.get("since")
            # Each heartbeat check has its own DAG's newest beat: the page shows the newest of
            # them, as it does from the tables.
            beat = entry.get("last_beat")
            if isinstance(beat, (int, float)) and (last_beat is None or beat > last_beat):
                last_beat = beat
            checks.append(
                {
                    "name": name,
                    "state": entry.get("state"),
                    "since": since,
                    "for_s": max(0.0, now - since) if isinstance(since, (int, float)) else None,
                    "incident": entry.get("incident"),
                    "alerted": entry.get("alerted"),
                    "reason": entry.get("reason"),
                }
            )
    state: dict[str, Any] = {
        "source": "status_api",
        "replica": doc.get("replica"),
        "generated_at": doc.get("generated_at"),
        "checks": checks,
        "open_incidents": doc.get("open_incidents", []),
        "alerts": [],
        "last_heartbeat_at": last_beat,
        "seconds_since_heartbeat": None if last_beat is None else max(0.0, now - last_beat),
    }
    ledger = doc.get("ledger") or {}
    if not ledger.get("readable", True):
        state["note"] = f"the watchdog cannot read its ledger: {ledger.get('error')}"
    return state


def watchdog_state(conn: Connection, now: float, status_url: str = "") -> dict[str, Any]:
    """The watchdog's state: from its status API when ``status_url`` is set, else from its tables."""
    if status_url:
        try:
            return from_status_api(status_url, now)
        except Exception as exc:
            state = from_tables(conn, now)
            state["note"] = (
                f"status API {status_url} did not answer ({type(exc).__name__}: {exc}); read the tables"
            )
            return state
    return from_tables(conn, now)
