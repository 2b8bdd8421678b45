"""The durable alert outbox: queued before sending, marked sent only after the receiver said 2xx.

An alert row is inserted in the same transaction as the state transition that calls for it
(:func:`onceflow.watchdog.incidents.apply`), one row per channel, under a unique
``dedup_key``. :meth:`Outbox.deliver` takes a short lease on a due row by compare-and-set
(so two replicas never send the same row at once), sends it, and marks it ``sent`` only when the
webhook answered 2xx or the SMTP server accepted the message. A failure reschedules the row with
exponential backoff; after ``max_attempts`` a CRITICAL log line says the alert is stuck, and
delivery goes on at the longest backoff, so the alert arrives once the receiver is back.

The one window for a repeat: the receiver accepted, then the watchdog died before its UPDATE
committed. The webhook carries the dedup key in the ``Idempotency-Key`` header and the payload
(and e-mails in ``Message-ID``) so a receiver can drop that repeat.
"""

from __future__ import annotations

import json
import logging
import smtplib
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from onceflow.watchdog.schema import alerts

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from onceflow.watchdog.config import AlertConfig, CheckConfig
    from onceflow.watchdog.incidents import Incident, Verdict

log = logging.getLogger(__name__)

QUEUED, SENT, SUPPRESSED = "queued", "sent", "suppressed"
WEBHOOK, EMAIL = "webhook", "email"

_EMOJI = {"down": ":red_circle:", "reminder": ":red_circle:", "recovery": ":large_green_circle:"}
_TITLE = {"down": "DOWN", "reminder": "STILL DOWN", "recovery": "RECOVERED"}


class DeliveryError(RuntimeError):
    pass


def render(check: CheckConfig, incident: Incident, kind: str, verdict: Verdict, now: float) -> dict[str, Any]:
    """A Slack-compatible message (``text``) with the structured facts beside it (``onceflow``)."""
    lines = [
        f"{_EMOJI[kind]} onceflow watchdog: {check.name} {_TITLE[kind]} (incident {incident.incident})",
        f"Reason: {verdict.reason}",
    ]
    lines += [f"• {k}: {v}" for k, v in sorted(verdict.evidence.items())]
    lines.append(f"Runbook: {check.runbook}")
    return {
        "text": "\n".join(lines),
        "onceflow": {
            "check": check.name,
            "kind": kind,
            "incident": incident.incident,
            "state": incident.state,
            "since": incident.since,
            "reason": verdict.reason,
            "evidence": verdict.evidence,
            "runbook": check.runbook,
            "queued_at": now,
        },
    }


class Outbox:
    """Queue and deliver alerts for one database (the ledger, or the watchdog's local file).

    :param config: the ``[alerts]`` table.
    :param owner: this replica's name, for delivery leases.
    """

    def __init__(self, config: AlertConfig, owner: str) -> None:
        self.config = config
        self.owner = owner
        self.reminder_seconds = config.reminder_seconds

    @property
    def channels(self) -> list[str]:
        return [c for c, on in ((WEBHOOK, self.config.webhook_url), (EMAIL, self.config.smtp_url)) if on]

    def enqueue(
        self,
        conn: Connection,
        check: CheckConfig,
        incident: Incident,
        kind: str,
        verdict: Verdict,
        *,
        now: float,
    ) -> None:
        n = f"/{incident.reminders}" if kind == "reminder" else ""
        payload = render(check, incident, kind, verdict, now)
        for channel in self.channels:
            key = f"{check.name}/{incident.incident}/{kind}{n}/{channel}"
            payload["onceflow"]["alert_id"] = key
            # ON CONFLICT DO NOTHING in effect: the unique key keeps a second enqueue out.
            exists = conn.execute(sa.select(alerts.c.id).where(alerts.c.dedup_key == key)).first()
            if exists is None:
                conn.execute(
                    alerts.insert().values(
                        dedup_key=key,
                        check_name=check.name,
                        incident=incident.incident,
                        kind=kind,
                        channel=channel,
                        payload=json.dumps(payload, default=str),
                        state=QUEUED,
                        attempts=0,
                        next_attempt_at=now,
                        created_at=now,
                    )
                )
        if not self.channels:
            log.critical(
                "check %s: %s alert with no channel configured: %s", check.name, kind, payload["text"]
            )

    def deliver(self, engine: Engine, now: float) -> int:
        """Send every due row; return how many were accepted. Never raises for a receiver's failure."""
        with engine.connect() as conn:
            due = conn.execute(
                sa.select(alerts.c.id)
                .where(
                    alerts.c.state == QUEUED,
                    alerts.c.next_attempt_at <= now,
                    sa.or_(alerts.c.lease_until.is_(None), alerts.c.lease_until < now),
                )
                .order_by(alerts.c.id)
            ).all()
        sent = 0
        for (alert_id,) in due:
            row = self._lease(engine, alert_id, now)
            if row is None:
                continue  # another replica is sending it
            try:
                self._send(row)
            except Exception as exc:  # a receiver's failure must never stop the watchdog
                self._failed(engine, row, exc, now)
                continue
            with engine.begin() as conn:
                conn.execute(
                    alerts.update()
                    .where(alerts.c.id == alert_id, alerts.c.lease_owner == self.owner)
                    .values(state=SENT, sent_at=now, attempts=row["attempts"] + 1, lease_until=None)
                )
            log.info("alert %s sent (attempt %d)", row["dedup_key"], row["attempts"] + 1)
            sent += 1
        return sent

    def _lease(self, engine: Engine, alert_id: int, now: float) -> dict[str, Any] | None:
        hold = self.config.send_timeout * 3 + 5
        with engine.begin() as conn:
            result = conn.execute(
                alerts.update()
                .where(
                    alerts.c.id == alert_id,
                    alerts.c.state == QUEUED,
                    sa.or_(alerts.c.lease_until.is_(None), alerts.c.lease_until < now),
                )
                .values(lease_owner=self.owner, lease_until=now + hold)
            )
            if result.rowcount != 1:
                return None
            return dict(conn.execute(sa.select(alerts).where(alerts.c.id == alert_id)).one()._mapping)

    def _failed(self, engine: Engine, row: dict[str, Any], exc: Exception, now: float) -> None:
        attempts = row["attempts"] + 1
        delay = min(self.config.backoff_seconds * 2 ** (attempts - 1), self.config.backoff_max_seconds)
        with engine.begin() as conn:
            conn.execute(
                alerts.update()
                .where(alerts.c.id == row["id"], alerts.c.lease_owner == self.owner)
                .values(
                    attempts=attempts,
                    next_attempt_at=now + delay,
                    lease_until=None,
                    last_error=repr(exc)[:2000],
                )
            )
        if attempts >= self.config.max_attempts:
            log.critical(
                "ALERT NOT DELIVERED: %s failed %d times (last: %r); retrying every %.0f s. Message: %s",
                row["dedup_key"],
                attempts,
                exc,
                delay,
                json.loads(row["payload"])["text"],
            )
        else:
            log.warning(
                "alert %s: attempt %d failed (%r); next in %.0f s", row["dedup_key"], attempts, exc, delay
            )

    def _send(self, row: dict[str, Any]) -> None:
        payload = json.loads(row["payload"])
        if row["channel"] == WEBHOOK:
            assert self.config.webhook_url is not None
            post_json(
                self.config.webhook_url, payload, self.config.send_timeout, idempotency_key=row["dedup_key"]
            )
        elif row["channel"] == EMAIL:
            self._send_email(row["dedup_key"], payload)
        else:
            raise DeliveryError(f"unknown channel {row['channel']!r}")

    def _send_email(self, key: str, payload: dict[str, Any]) -> None:
        assert self.config.smtp_url is not None
        parts = urlsplit(self.config.smtp_url)
        msg = EmailMessage()
        facts = payload["onceflow"]
        msg["Subject"] = (
            f"[onceflow watchdog] {facts['check']} {_TITLE[facts['kind']]} (incident {facts['incident']})"
        )
        msg["From"] = self.config.email_from
        msg["To"] = ", ".join(self.config.email_to)
        msg["Message-ID"] = f"<{key.replace('/', '.')}@onceflow-watchdog>"
        msg.set_content(payload["text"])
        with smtplib.SMTP(
            parts.hostname or "localhost", parts.port or 25, timeout=self.config.send_timeout
        ) as smtp:
            # Raises unless at least one recipient was accepted; retrying a partial refusal would
            # mail the accepted ones twice, so it is logged loudly instead.
            refused = smtp.send_message(msg)
        if refused:
            log.critical("alert %s: the SMTP server refused recipients %s", key, refused)


def post_json(url: str, payload: Any, timeout: float, *, idempotency_key: str | None = None) -> int:
    """POST JSON; return the status, raise :class:`DeliveryError` unless it is 2xx."""
    headers = {"Content-Type": "application/json"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    status, _ = http_request("POST", url, json.dumps(payload).encode(), headers, timeout)
    if not 200 <= status < 300:
        raise DeliveryError(f"{url} answered {status}")
    return status


def ping(url: str, timeout: float, body: str = "") -> bool:
    """A healthchecks.io-style ping; never raises (a monitor's outage must not stop the work)."""
    try:
        return 200 <= http_request("POST", url, body.encode(), {}, timeout)[0] < 300
    except Exception as exc:
        log.warning("ping %s failed: %r", url, exc)
        return False


def http_request(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> tuple[int, bytes]:
    """Send and read the whole answer within ``timeout`` seconds in total: (status, body).

    A socket timeout bounds each read only: an endpoint that drips a header byte every second
    would hold the beat (or the watchdog's pass, and past its alert lease) for ever. A timer
    shuts the socket down at the deadline, and whatever was read by then does not count.
    """
    import contextlib
    import http.client
    import socket
    import threading

    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "localhost", parts.port, timeout=timeout)
    expired = threading.Event()

    def abort() -> None:
        expired.set()
        if conn.sock is not None:
            with contextlib.suppress(OSError):  # already closed: nothing to stop
                conn.sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, abort)
    timer.daemon = True
    timer.start()
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        length = {"Content-Length": str(len(body))} if body is not None else {}
        conn.request(method, target, body=body, headers={**length, **headers})
        response = conn.getresponse()
        data = response.read()
        status = int(response.status)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise DeliveryError(f"{url}: no complete answer within {timeout:.0f} s") from exc
        raise DeliveryError(f"{url} unreachable: {exc}") from exc
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():  # the shutdown ended the answer early: it was not given in time
        raise DeliveryError(f"{url}: no complete answer within {timeout:.0f} s")
    return status, data
