"""``HeartbeatHook``: record one beat of the ``heartbeat`` DAG outside Airflow's metadata database.

A beat is one row of ``onceflow_heartbeats`` in the ledger database (connection
``onceflow_ledger``, the embedded SQLite file when it is not defined): the run id, when the run
was due, when its task actually started and the lag between the two, so a slow scheduler shows
before a dead one. The watchdog (``onceflow-watchdog``) reads these rows from outside Airflow.

Optionally each beat is also pinged to a healthchecks.io-compatible URL (``<url>/start``,
``<url>``, ``<url>/fail``, each with ``?rid=<uuid of the run id>``). Every ping has a short
timeout and never raises: a slow or dead monitoring endpoint must never block or fail the beat.
The ping URL is a secret (it can fake the beat): it is registered with Airflow's secrets masker
and only ever logged redacted (:mod:`onceflow.redact`).
"""

from __future__ import annotations

import socket
import uuid
from typing import Any, ClassVar

from airflow.sdk import BaseHook

from onceflow.hooks.ledger import LedgerHook

PING_TIMEOUT_SECONDS = 3.0


class HeartbeatHook(BaseHook):
    """Write beats to the ledger database and ping an external monitor.

    :param ledger_conn_id: the ledger's Airflow connection.
    :param ping_url: a healthchecks.io-style check URL (``https://hc-ping.com/<uuid>``), or None.
    """

    conn_name_attr: ClassVar[str] = "ledger_conn_id"
    default_conn_name: ClassVar[str] = "onceflow_ledger"
    conn_type: ClassVar[str] = "postgres"  # the ledger database (SQLite works too, as for LedgerHook)
    hook_name: ClassVar[str] = "onceflow heartbeat"

    def __init__(self, ledger_conn_id: str = default_conn_name, ping_url: str | None = None) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self.ping_url = ping_url.rstrip("/") if ping_url else None
        if self.ping_url:
            # Whoever reads the log could fake the heartbeat with it. Airflow masks the
            # connections and variables it reads itself; this URL may come from os.environ.
            from onceflow.redact import register_secret

            register_secret(self.ping_url, airflow=True)

    def ping(self, run_id: str, signal: str = "", body: str = "") -> bool:
        """``signal`` is ``""`` (success), ``"start"`` or ``"fail"``; returns whether it was accepted."""
        if not self.ping_url:
            return False
        from onceflow.watchdog.alerts import ping

        rid = uuid.uuid5(uuid.NAMESPACE_URL, run_id)  # healthchecks wants a UUID run id
        url = f"{self.ping_url}/{signal}" if signal else self.ping_url
        ok = ping(f"{url}?rid={rid}", timeout=PING_TIMEOUT_SECONDS, body=body)
        if not ok:
            from onceflow.redact import redact_url

            self.log.warning(
                "heartbeat ping %s not accepted; the beat is recorded in the ledger anyway", redact_url(url)
            )
        return ok

    def record_beat(
        self, *, dag_id: str, run_id: str, scheduled_at: float, started_at: float, try_number: int
    ) -> dict[str, Any]:
        """Insert the beat (a retry of the same run keeps the first attempt's row) and return it."""
        import sqlalchemy as sa

        from onceflow.watchdog.schema import ensure_schema, heartbeats

        engine = LedgerHook(self.ledger_conn_id).engine
        ensure_schema(engine, [heartbeats])
        beat = {
            "dag_id": dag_id,
            "run_id": run_id,
            "scheduled_at": scheduled_at,
            "started_at": started_at,
            "lag_seconds": max(0.0, started_at - scheduled_at),
            "try_number": try_number,
            "hostname": socket.gethostname()[:250],
        }
        try:
            with engine.begin() as conn:
                conn.execute(heartbeats.insert().values(**beat))
        except sa.exc.IntegrityError:
            self.log.info("beat of run %s already recorded (a retry)", run_id)
        return beat
