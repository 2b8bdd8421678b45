"""The status API: ``onceflow-watchdog status`` prints it; ``[status] port`` serves it on loopback.

:func:`collect` returns one JSON object::

    {"replica": "wd-1", "generated_at": 1800000000.0,
     "ledger": {"readable": true, "error": null},
     "checks": {"heartbeat": {"kind": "heartbeat", "state": "down", "since": ..., "incident": 3,
                              "alerted": true, "reason": "...", "last_beat": ...,
                              "flips": [{"at": ..., "from": "late", "to": "down", "incident": 3}]}},
     "open_incidents": ["heartbeat"],
     "blind": {"watchdog.blind.ledger": {"state": "down", "since": ..., ...}},
     "last_pass": {"started_at": ..., "seconds": 0.04, "states": {...}, "blind": {...}},
     "pass_running_seconds": null}

Over HTTP (:func:`serve`, 127.0.0.1 only, read-only): ``GET /status`` is that object (503 if the
ledger could not be read within the deadline); ``GET /health`` answers from memory alone, never
touching a store, for a load balancer: 200 while the last pass finished in budget, recently, and
saw everything; 503 with the reason otherwise.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.watchdog import incidents
from onceflow.watchdog.incidents import UP
from onceflow.watchdog.runner import EXIT_BLIND, EXIT_FAILING, EXIT_OK, _short
from onceflow.watchdog.schema import flips, heartbeats

if TYPE_CHECKING:
    from onceflow.watchdog.runner import Watchdog


def collect(wd: Watchdog) -> dict[str, Any]:
    """The status object (see the module docstring); reads the ledger with its deadlines."""
    report: dict[str, Any] = {
        "replica": wd.owner,
        "generated_at": wd.local_clock(),
        "ledger": {"readable": True, "error": None},
        "checks": {},
        "open_incidents": [],
        "blind": wd.blind_states(),
        "last_pass": wd.last_pass,
        "pass_running_seconds": None
        if wd.pass_started is None
        else round(time.monotonic() - wd.pass_started, 3),
    }
    try:
        stored = incidents.read_all(wd.ledger)
        with wd.ledger.connect() as conn:
            # Each heartbeat check's own newest beat, read as the check reads it (its dag_id's).
            last_beat = {
                check.name: conn.execute(_newest_beat(check.options.get("dag_id"))).scalar()
                for check in wd.config.checks
                if check.kind == "heartbeat"
            }
            recent = {
                check.name: [
                    {"at": r.at, "from": r.from_state, "to": r.to_state, "incident": r.incident}
                    for r in conn.execute(
                        sa.select(flips)
                        .where(flips.c.check_name == check.name)
                        .order_by(flips.c.id.desc())
                        .limit(wd.config.status_flips)
                    )
                ]
                for check in wd.config.checks
            }
    except Exception as exc:
        report["ledger"] = {"readable": False, "error": _short(exc)}
        return report
    for check in wd.config.checks:
        inc = stored.get(check.name)
        entry: dict[str, Any] = {
            "kind": check.kind,
            "state": inc.state if inc else "unknown",
            "since": inc.since if inc else None,
            "incident": inc.incident if inc else 0,
            "alerted": inc.alerted if inc else False,
            "reason": inc.reason if inc else None,
            "flips": recent.get(check.name, []),
        }
        if check.kind == "heartbeat":
            entry["last_beat"] = last_beat[check.name]
        report["checks"][check.name] = entry
        if inc is not None and inc.state != UP:
            report["open_incidents"].append(check.name)
    return report


def _newest_beat(dag_id: str | None) -> sa.Select[tuple[float]]:
    query = sa.select(sa.func.max(heartbeats.c.started_at))
    return query if not dag_id else query.where(heartbeats.c.dag_id == dag_id)


def exit_code(report: dict[str, Any]) -> int:
    """As ``--once``: 3 blind (or the ledger unreadable), 1 something not up, 0 all up."""
    if report["blind"] or not report["ledger"]["readable"]:
        return EXIT_BLIND
    return EXIT_FAILING if report["open_incidents"] else EXIT_OK


def health(wd: Watchdog) -> tuple[bool, str]:
    """From memory only: is this replica seeing everything, in time?"""
    budget = wd.config.pass_budget
    if wd.pass_started is not None and time.monotonic() - wd.pass_started > budget:
        return False, f"a pass has been running over its {budget:.0f} s budget"
    if not wd.last_pass:
        return False, "no pass finished yet"
    if wd.last_pass["blind"]:
        return False, f"blind: {', '.join(sorted(wd.last_pass['blind']))}"
    # Monotonic: a step of the host clock neither fakes a stale loop nor hides one.
    age = time.monotonic() - (wd.last_pass_monotonic or 0.0)
    if age > wd.config.loop_seconds + 2 * budget:
        return False, f"the last pass started {age:.0f} s ago"
    return True, "ok"


def serve(wd: Watchdog, port: int, *, deadline: float | None = None) -> ThreadingHTTPServer:
    """Serve ``/status`` and ``/health`` on 127.0.0.1:``port`` in a daemon thread; returns the server."""
    limit = deadline if deadline is not None else wd.config.statement_timeout + 2

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body, default=str, sort_keys=True).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                ok, why = health(wd)
                self._reply(200 if ok else 503, {"ok": ok, "reason": why})
            elif path == "/status":
                box: dict[str, Any] = {}
                worker = threading.Thread(target=lambda: box.update(report=collect(wd)), daemon=True)
                worker.start()
                worker.join(limit)
                if "report" not in box:
                    self._reply(503, {"error": f"the ledger did not answer within {limit:.0f} s"})
                else:
                    report = box["report"]
                    self._reply(200 if report["ledger"]["readable"] else 503, report)
            else:
                self._reply(404, {"error": "not found; try /status or /health"})

        def do_POST(self) -> None:
            self._reply(405, {"error": "read-only"})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="onceflow-watchdog-status", daemon=True).start()
    return server
