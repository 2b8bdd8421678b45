"""The durable alert outbox: queued before sending, marked sent only while this replica's lease holds.

An alert row is inserted in the same transaction as the state transition that calls for it
(:func:`onceflow.watchdog.incidents.apply`), one row per channel, under a unique ``dedup_key``
(``<check>/<incident>/<kind>[/<n>]/<channel>``; blindness incidents, numbered in each replica's
own state file, carry that file's random id: ``<check>/<id>.<incident>/...``).

Delivery promises, per check and channel:

* **In order.** A row is due only when no earlier row of the same check and channel is still
  queued, so a recovery waits for its down alert (even through the down alert's retry backoff).
  A check that recovers before its down alert went out gets one message, "was down for N s and is
  up", instead of both (the queued, unleased down row is marked ``superseded`` in the recovery's
  transaction).
* **At most once without a crash.** :meth:`Outbox.deliver` leases one row (or one group) at a
  time under a fresh lease token, and renews the leases with the clock read as the send starts
  (leasing a group's rows one by one takes time on a slow store); every send has a total
  deadline (``send_timeout_seconds``, webhook and SMTP alike) shorter than the lease; "mark sent"
  is ``UPDATE ... WHERE lease_owner = <token>``, so a replica whose lease was taken over cannot
  mark, and a lease cannot expire while its send is still running.
* **At least once.** A failure reschedules with exponential backoff; after ``max_attempts`` a
  CRITICAL log line says the alert is stuck, and delivery goes on at the longest backoff. After a
  failed send, the rest of that channel waits for the next pass: a receiver that hangs costs a
  pass one deadline, not one per queued alert.

The one window for a repeat: the receiver accepted, then the watchdog died (or its store hung past
the lease) before "mark sent" committed, or the receiver took the message after the send's
deadline. Webhooks carry the key in ``Idempotency-Key`` and the payload (e-mails in
``Message-ID``) so a receiver can drop that repeat: a row is always resent under the key of its
first try (a group's rows as that group, see below).

**Grouping**: down alerts of one channel that are due together (queued in one pass, or within
``group_wait_seconds``) go out as one message listing them, up to ``group_max``, under the first
member's key plus ``+<n>``. Only rows never tried form a group; the group's key and members are
written into their rows as its send starts, and a retry sends the members still queued, all
leased together or not at all, under that key.

**Untrusted text**: reasons and evidence carry values from outside (a sheet cell, an HTTP answer).
Each channel's text neutralises them (:func:`neutralise`): newlines and control characters
collapsed, length capped, and for Slack ``&``, ``<``, ``>`` escaped and values in backticks, so a
value cannot add a line, a mention (``<!channel>``) or a link. Secrets are redacted
(:mod:`onceflow.redact`) in every payload, error, ledger row and log line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import smtplib
import socket
import threading
import uuid
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from onceflow.redact import redact_text, redact_url
from onceflow.watchdog.schema import alerts

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Connection, Engine

    from onceflow.watchdog.config import AlertConfig, CheckConfig
    from onceflow.watchdog.incidents import Incident, Verdict

log = logging.getLogger(__name__)

QUEUED, SENT, SUPPRESSED, SUPERSEDED = "queued", "sent", "suppressed", "superseded"
WEBHOOK, EMAIL = "webhook", "email"
#: Margin between a send's total deadline and its lease: the UPDATE that marks it sent.
LEASE_MARGIN_SECONDS = 5.0
#: Longest text of one untrusted value in a message.
VALUE_LIMIT = 300

_EMOJI = {
    "down": ":red_circle:",
    "reminder": ":red_circle:",
    "recovery": ":large_green_circle:",
    "flapping": ":large_orange_circle:",
}
_TITLE = {"down": "DOWN", "reminder": "STILL DOWN", "recovery": "RECOVERED", "flapping": "FLAPPING"}


class DeliveryError(RuntimeError):
    """An alert could not be sent (the receiver refused it or did not answer); it is retried."""

    pass


# -- rendering -------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\u0085]+")
_URLISH = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+")


def neutralise(value: Any, channel: str, *, quote: bool = True, limit: int = VALUE_LIMIT) -> str:
    """``value`` as one inert line of ``channel``'s text (see the module docstring).

    :param quote: Slack: the whole value in backticks (code: no link, no mention, no markup);
        otherwise only URL-like parts are. E-mail: the value in double quotes when ``quote``.
    """
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    text = _CONTROL.sub(" ", redact_text(text)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if channel == WEBHOOK:
        text = text.replace("`", "'").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return f"`{text}`" if quote else _URLISH.sub(lambda m: f"`{m.group(0)}`", text)
    return f'"{text}"' if quote else text


def render(
    check: CheckConfig,
    incident: Incident,
    kind: str,
    verdict: Verdict,
    now: float,
    channel: str = WEBHOOK,
    *,
    note: str | None = None,
) -> dict[str, Any]:
    """A Slack-compatible message (``text``) with the structured facts beside it (``onceflow``).

    The check's name and runbook come from the config (trusted); the reason and evidence do not.
    """
    lines = [
        f"{_EMOJI[kind]} onceflow watchdog: {check.name} {_TITLE[kind]} (incident {incident.incident})",
        f"Reason: {neutralise(verdict.reason, channel, quote=False)}",
    ]
    if note:
        lines.append(note)
    lines += [f"• {k}: {neutralise(v, channel)}" for k, v in sorted(verdict.evidence.items())]
    lines.append(f"Runbook: {check.runbook}")
    evidence = json.loads(redact_text(json.dumps(verdict.evidence, default=str)))
    return {
        "text": "\n".join(lines),
        "onceflow": {
            "check": check.name,
            "kind": kind,
            "incident": incident.incident,
            "state": incident.state,
            "since": incident.since,
            "reason": redact_text(verdict.reason)[:2000],
            "evidence": evidence,
            "runbook": check.runbook,
            "queued_at": now,
        },
    }


def render_group(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One message for several down alerts of one channel (grouping)."""
    names = ", ".join(p["onceflow"]["check"] for p in payloads)
    head = f"{_EMOJI['down']} onceflow watchdog: {len(payloads)} checks DOWN: {names}"
    return {
        "text": "\n\n".join([head, *(p["text"] for p in payloads)]),
        "onceflow": {
            "kind": "group",
            "alert_ids": [p["onceflow"]["alert_id"] for p in payloads],
            "alerts": [p["onceflow"] for p in payloads],
        },
    }


# -- the outbox ------------------------------------------------------------------------------


class Outbox:
    """Queue and deliver alerts for one database (the ledger, or the watchdog's local file).

    :param config: the ``[alerts]`` table.
    :param owner: this replica's name, for delivery leases.
    :param key_scope: put into every key (``<check>/<scope>.<incident>/...``): a store whose
        incident numbers are not shared by every replica (the local blindness file) sets a random
        id of that file, so two files' "incident 1" never share a key.
    """

    def __init__(self, config: AlertConfig, owner: str, *, key_scope: str = "") -> None:
        self.config = config
        self.owner = owner
        self.key_scope = key_scope
        self.reminder_seconds = config.reminder_seconds

    @property
    def channels(self) -> list[str]:
        """The channels configured: ``webhook`` and/or ``email``."""
        return [c for c, on in ((WEBHOOK, self.config.webhook_url), (EMAIL, self.config.smtp_url)) if on]

    def key(self, check_name: str, incident: int, kind: str, channel: str) -> str:
        """The alert's unique key (also its idempotency key): check, incident, kind, channel."""
        scope = f"{self.key_scope}." if self.key_scope else ""
        return f"{check_name}/{scope}{incident}/{kind}/{channel}"

    def enqueue(
        self,
        conn: Connection,
        check: CheckConfig,
        incident: Incident,
        kind: str,
        verdict: Verdict,
        *,
        now: float,
        down_since: float | None = None,
    ) -> None:
        """Queue ``kind`` for every channel, inside the caller's transaction (the transition's).

        :param down_since: for a recovery, when the check went down (for "was down for N s").
        """
        n = f"/{incident.reminders}" if kind == "reminder" else ""
        for channel in self.channels:
            note = None
            if kind == "recovery" and self._supersede_unsent(
                conn, check.name, incident.incident, channel, now
            ):
                took = f" for {now - down_since:.0f} s" if down_since is not None else ""
                note = f"It was down{took} and is up again; its DOWN alert had not been delivered yet."
            payload = render(check, incident, kind, verdict, now, channel, note=note)
            key = self.key(check.name, incident.incident, f"{kind}{n}", channel)
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
        if not self.channels:  # only with log_only = true: the log line is the alert
            text = render(check, incident, kind, verdict, now, EMAIL)["text"]
            log.critical(
                "check %s: %s alert (log_only, no channel): %s", check.name, kind, text.replace("\n", " | ")
            )

    def _supersede_unsent(
        self, conn: Connection, check_name: str, incident: int, channel: str, now: float
    ) -> bool:
        """Mark this incident's queued, unleased messages of ``channel`` superseded; True if its
        down alert was among them (it was never delivered, and now never will be)."""
        pending = (
            alerts.c.check_name == check_name,
            alerts.c.incident == incident,
            alerts.c.channel == channel,
        )
        free = sa.or_(alerts.c.lease_until.is_(None), alerts.c.lease_until < now)
        down = conn.execute(
            alerts.update()
            .where(*pending, alerts.c.kind == "down", alerts.c.state == QUEUED, free)
            .values(state=SUPERSEDED, lease_until=None)
        ).rowcount
        conn.execute(
            alerts.update()
            .where(*pending, alerts.c.kind == "reminder", alerts.c.state == QUEUED, free)
            .values(state=SUPERSEDED, lease_until=None)
        )
        return down == 1

    # -- delivery ----------------------------------------------------------------------------

    def deliver(
        self, engine: Engine, clock: Callable[[], float] | float, *, failed_channels: set[str] | None = None
    ) -> int:
        """Send every due row, one lease at a time; return how many rows were accepted.

        Never raises for a receiver's failure (a store's failure does raise: the caller turns it
        into blindness). ``clock`` is read when each send starts.

        :param failed_channels: channels to leave alone, and where a failed send adds its channel:
            after one failure the rest of that channel waits for the next pass, so a receiver
            that hangs costs a pass one send deadline, not one per queued alert (a pass shares the
            set between the ledger's outbox and the local one).
        """
        now_fn: Callable[[], float] = clock if callable(clock) else (lambda: float(clock))
        failed = set() if failed_channels is None else failed_channels
        tried: set[int] = set()
        sent = 0
        while True:
            now = now_fn()
            due = [r for r in self._due(engine, now) if r.id not in tried and r.channel not in failed]
            if not due:
                return sent
            token = f"{self.owner}#{uuid.uuid4().hex[:12]}"
            ids = self._take(engine, due, token, now)
            tried.update(ids or [due[0].id])
            if not ids:
                continue  # another replica is sending it
            started = self._start_send(engine, ids, token, now_fn())
            if started is None:
                continue  # the leases ran out while they were being taken (a slow store)
            rows, key = started
            if self._send_group(engine, rows, key, token, now_fn):
                sent += len(rows)
            else:
                failed.add(rows[0]["channel"])

    def _due(self, engine: Engine, now: float) -> list[Any]:
        """Queued rows that may be sent now, oldest first: due, not leased, and with no earlier
        queued row of the same check and channel (that one goes first, whatever its backoff)."""
        c = alerts.c
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    c.id,
                    c.check_name,
                    c.channel,
                    c.kind,
                    c.attempts,
                    c.created_at,
                    c.next_attempt_at,
                    c.lease_until,
                )
                .where(c.state == QUEUED)
                .order_by(c.id)
            ).all()
        wait = self.config.group_wait_seconds
        blocked: set[tuple[str, str]] = set()
        due = []
        for r in rows:
            lane = (r.check_name, r.channel)
            if lane in blocked:
                continue
            blocked.add(lane)
            leased = r.lease_until is not None and r.lease_until >= now
            waiting = r.kind == "down" and r.created_at + wait > now
            if r.next_attempt_at <= now and not leased and not waiting:
                due.append(r)
        return due

    def _take(self, engine: Engine, due: list[Any], token: str, now: float) -> list[int]:
        """Lease the first due row and what goes with it; return the ids leased under ``token``.

        A row whose send was started before keeps the company it had: alone, or the group its
        payload names (all of that group's rows still queued, or none), so a repeat carries the
        first try's Idempotency-Key. Rows never tried join a new group (down alerts, one channel).
        """
        first = due[0]
        if first.attempts:
            with engine.connect() as conn:
                payload = json.loads(
                    conn.execute(sa.select(alerts.c.payload).where(alerts.c.id == first.id)).scalar_one()
                )
            if "group" in payload:
                return self._lease_all(engine, payload["group"]["ids"], token, now)
        if self._lease(engine, first.id, token, now) is None:
            return []
        ids = [first.id]
        if first.kind == "down" and not first.attempts and self.config.group_max > 1:
            for r in due[1:]:
                if len(ids) >= self.config.group_max:
                    break
                fresh = r.kind == "down" and r.channel == first.channel and not r.attempts
                if fresh and self._lease(engine, r.id, token, now) is not None:
                    ids.append(r.id)
        return ids

    def _lease(self, engine: Engine, alert_id: int, token: str, now: float) -> int | None:
        with engine.begin() as conn:
            return self._lease_where(conn, alerts.c.id == alert_id, token, now) or None

    def _lease_all(self, engine: Engine, ids: list[int], token: str, now: float) -> list[int]:
        """Lease every still-queued row of ``ids`` in one transaction, or none of them."""
        with engine.connect() as conn, conn.begin() as tx:
            leased = self._lease_where(conn, alerts.c.id.in_(ids), token, now)
            queued = conn.execute(
                sa.select(alerts.c.id).where(alerts.c.id.in_(ids), alerts.c.state == QUEUED)
            ).scalars()
            queued_ids = sorted(queued)
            if leased != len(queued_ids):  # another replica holds some of them: its send goes on
                tx.rollback()
                return []
        return queued_ids

    def _lease_where(self, conn: Connection, which: Any, token: str, now: float) -> int:
        hold = self.config.send_timeout + LEASE_MARGIN_SECONDS
        free = sa.or_(alerts.c.lease_until.is_(None), alerts.c.lease_until < now)
        result = conn.execute(
            alerts.update()
            .where(which, alerts.c.state == QUEUED, free)
            .values(lease_owner=token, lease_until=now + hold)
        )
        return int(result.rowcount)

    def _start_send(
        self, engine: Engine, ids: list[int], token: str, now: float
    ) -> tuple[list[dict[str, Any]], str] | None:
        """Renew the leases with the clock read as the send starts (taking a group's leases took
        time), count the attempt, and fix a new group's key in its rows; return the rows still
        held and the Idempotency-Key, or ``None`` if none is held any more."""
        hold = self.config.send_timeout + LEASE_MARGIN_SECONDS
        mine = (alerts.c.id.in_(ids), alerts.c.lease_owner == token, alerts.c.state == QUEUED)
        with engine.begin() as conn:
            conn.execute(
                alerts.update().where(*mine).values(lease_until=now + hold, attempts=alerts.c.attempts + 1)
            )
            rows = [
                dict(r._mapping) for r in conn.execute(sa.select(alerts).where(*mine).order_by(alerts.c.id))
            ]
            if not rows:
                return None
            payloads = [json.loads(r["payload"]) for r in rows]
            pinned = payloads[0].get("group")
            if pinned is None and len(rows) == 1:
                return rows, rows[0]["dedup_key"]
            key = pinned["key"] if pinned else f"{rows[0]['dedup_key']}+{len(rows) - 1}"
            for row, payload in zip(rows, payloads, strict=True):
                if "group" not in payload:
                    payload["group"] = {"key": key, "ids": [r["id"] for r in rows]}
                    row["payload"] = json.dumps(payload, default=str)
                    conn.execute(
                        alerts.update().where(alerts.c.id == row["id"]).values(payload=row["payload"])
                    )
        return rows, key

    def _send_group(
        self, engine: Engine, group: list[dict[str, Any]], key: str, token: str, now_fn: Callable[[], float]
    ) -> bool:
        """Send the rows as one message under ``key``; mark them sent (or failed) under ``token``."""
        payloads = [json.loads(r["payload"]) for r in group]
        single = len(group) == 1 and key == group[0]["dedup_key"]
        payload = payloads[0] if single else render_group(payloads)
        payload.pop("group", None)
        try:
            self._send(group[0]["channel"], key, payload)
        except Exception as exc:  # a receiver's failure must never stop the watchdog
            self._failed(engine, group, token, exc, now_fn())
            return False
        done = now_fn()
        with engine.begin() as conn:
            marked = conn.execute(
                alerts.update()
                .where(
                    alerts.c.id.in_([r["id"] for r in group]),
                    alerts.c.lease_owner == token,
                    alerts.c.state == QUEUED,
                )
                .values(state=SENT, sent_at=done, lease_until=None)
            ).rowcount
        if marked != len(group):
            # Who holds it now, and until when, against this send's clock: what a post-mortem needs.
            # Only a diagnosis: a store failing this read must not turn the pass blind.
            holders: Any
            try:
                with engine.connect() as conn:
                    holders = [
                        tuple(h)
                        for h in conn.execute(
                            sa.select(
                                alerts.c.id, alerts.c.state, alerts.c.lease_owner, alerts.c.lease_until
                            ).where(alerts.c.id.in_([r["id"] for r in group]))
                        )
                    ]
            except Exception as exc:
                holders = f"unreadable ({redact_text(repr(exc))[:200]})"
            log.error(
                "alert %s sent, but its lease was taken over before it was marked sent (token %s, "
                "its lease ran to %s, the send ended at %s; rows now (id, state, owner, until): %s)",
                key,
                token,
                group[0]["lease_until"],
                done,
                holders,
            )
        log.info("alert %s sent (attempt %d)", key, group[0]["attempts"])
        return True

    def _failed(
        self, engine: Engine, group: list[dict[str, Any]], token: str, exc: Exception, now: float
    ) -> None:
        attempts = group[0]["attempts"]  # sends started, this one included
        delay = min(self.config.backoff_seconds * 2 ** (attempts - 1), self.config.backoff_max_seconds)
        error = redact_text(repr(exc))
        with engine.begin() as conn:
            conn.execute(
                alerts.update()
                .where(alerts.c.id.in_([r["id"] for r in group]), alerts.c.lease_owner == token)
                .values(next_attempt_at=now + delay, lease_until=None, last_error=error[:2000])
            )
        for row in group:
            if attempts >= self.config.max_attempts:
                log.critical(
                    "ALERT NOT DELIVERED: %s failed %d times (last: %s); retrying every %.0f s. Message: %s",
                    row["dedup_key"],
                    attempts,
                    error,
                    delay,
                    redact_text(json.loads(row["payload"])["text"]),
                )
            else:
                log.warning(
                    "alert %s: attempt %d failed (%s); next in %.0f s",
                    row["dedup_key"],
                    attempts,
                    error,
                    delay,
                )

    def _send(self, channel: str, key: str, payload: dict[str, Any]) -> None:
        if channel == WEBHOOK:
            assert self.config.webhook_url is not None
            post_json(self.config.webhook_url, payload, self.config.send_timeout, idempotency_key=key)
        elif channel == EMAIL:
            self._send_email(key, payload)
        else:
            raise DeliveryError(f"unknown channel {channel!r}")

    def _send_email(self, key: str, payload: dict[str, Any]) -> None:
        assert self.config.smtp_url is not None
        parts = urlsplit(self.config.smtp_url)
        msg = EmailMessage()
        facts = payload["onceflow"]
        if facts["kind"] == "group":
            subject = f"[onceflow watchdog] {len(facts['alerts'])} checks DOWN"
        else:
            subject = (
                f"[onceflow watchdog] {facts['check']} {_TITLE[facts['kind']]} (incident {facts['incident']})"
            )
        msg["Subject"] = subject
        msg["From"] = self.config.email_from
        msg["To"] = ", ".join(self.config.email_to)
        msg["Message-ID"] = f"<{re.sub(r'[^A-Za-z0-9.+_-]', '.', key)}@onceflow-watchdog>"
        msg.set_content(payload["text"])
        timeout = self.config.send_timeout
        with _deadline(timeout) as watch:
            try:
                smtp = smtplib.SMTP(timeout=timeout)
                watch.target = smtp
                smtp.connect(parts.hostname or "localhost", parts.port or 25)
                with smtp:
                    if parts.username and parts.password:
                        smtp.login(parts.username, parts.password)
                    # Raises unless at least one recipient was accepted; retrying a partial refusal
                    # would mail the accepted ones twice, so it is logged loudly instead.
                    refused = smtp.send_message(msg)
            except (OSError, smtplib.SMTPException) as exc:
                if watch.expired.is_set():
                    raise DeliveryError(
                        f"SMTP {redact_url(self.config.smtp_url)}: not done within {timeout:g} s"
                    ) from exc
                raise DeliveryError(
                    f"SMTP {redact_url(self.config.smtp_url)}: {redact_text(str(exc))}"
                ) from exc
        if watch.expired.is_set():
            raise DeliveryError(f"SMTP {redact_url(self.config.smtp_url)}: not done within {timeout:g} s")
        if refused:
            log.critical("alert %s: the SMTP server refused recipients %s", key, refused)


class _deadline:
    """Shut the target's socket down at the deadline: a total bound on a conversation whose library
    only bounds each read (http.client, smtplib)."""

    def __init__(self, seconds: float) -> None:
        self.target: Any = None
        self.expired = threading.Event()
        self._timer = threading.Timer(seconds, self._abort)
        self._timer.daemon = True

    def _abort(self) -> None:
        self.expired.set()
        sock = getattr(self.target, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: nothing to stop
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def post_json(url: str, payload: Any, timeout: float, *, idempotency_key: str | None = None) -> int:
    """POST JSON; return the status, raise :class:`DeliveryError` unless it is 2xx."""
    headers = {"Content-Type": "application/json"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    status, _ = http_request("POST", url, json.dumps(payload).encode(), headers, timeout)
    if not 200 <= status < 300:
        raise DeliveryError(f"{redact_url(url)} answered {status}")
    return status


def ping(url: str, timeout: float, body: str = "") -> bool:
    """A healthchecks.io-style ping; never raises (a monitor's outage must not stop the work)."""
    try:
        return 200 <= http_request("POST", url, body.encode(), {}, timeout)[0] < 300
    except Exception as exc:
        log.warning("ping %s failed: %s", redact_url(url), redact_text(repr(exc)))
        return False


def http_request(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> tuple[int, bytes]:
    """Send and read the whole answer within ``timeout`` seconds in total: (status, body).

    A socket timeout bounds each read only: an endpoint that drips a header byte every second
    would hold the beat (or the watchdog's pass, and past its alert lease) for ever. A timer
    shuts the socket down at the deadline, and whatever was read by then does not count.
    Errors name the URL redacted (:func:`onceflow.redact.redact_url`).
    """
    import http.client

    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "localhost", parts.port, timeout=timeout)
    shown = redact_url(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with _deadline(timeout) as watch:
        watch.target = conn
        try:
            length = {"Content-Length": str(len(body))} if body is not None else {}
            conn.request(method, target, body=body, headers={**length, **headers})
            response = conn.getresponse()
            data = response.read()
            status = int(response.status)
        except (OSError, http.client.HTTPException) as exc:
            if watch.expired.is_set():
                raise DeliveryError(f"{shown}: no complete answer within {timeout:g} s") from exc
            raise DeliveryError(f"{shown} unreachable: {redact_text(str(exc))}") from exc
        finally:
            conn.close()
    if watch.expired.is_set():  # the shutdown ended the answer early: it was not given in time
        raise DeliveryError(f"{shown}: no complete answer within {timeout:g} s")
    return status, data
