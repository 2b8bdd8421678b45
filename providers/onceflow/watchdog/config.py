"""The watchdog's TOML configuration, validated completely before anything runs.

Every error names the offending key (as a dotted path) and its value, so a typo in a
crontab-driven config shows up in the first run's output, not as a silent default::

    ledger_url = "postgresql+psycopg2://watchdog@db/ledger"
    state_dir = "/var/lib/onceflow-watchdog"
    loop_seconds = 15
    runbook_base = "https://git.example.com/onceflow/blob/main/docs/watchdog.md"

    [self_heartbeat]
    url = "https://hc-ping.com/<uuid>"

    [alerts]
    webhook_url = "https://hooks.slack.com/services/..."
    reminder_seconds = 3600

    [checks.heartbeat]
    period_seconds = 60
    grace_seconds = 120
    max_lag_seconds = 30

See ``docs/watchdog.md`` for the full reference.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib

HTTP_SCHEMES = frozenset({"http", "https"})
SQL_SCHEMES = ("postgresql", "sqlite")
CHECK_KINDS = ("heartbeat", "api_health", "business_freshness", "sheet_queue", "article_queue")


class ConfigError(ValueError):
    """The configuration is unusable; the message names the key and the value."""


@dataclass(frozen=True)
class Window:
    """A silence or maintenance window: alerts for the check are held back, transitions still recorded."""

    start: float
    end: float
    reason: str

    def covers(self, when: float) -> bool:
        return self.start <= when < self.end


@dataclass(frozen=True)
class CheckConfig:
    """One check. ``period``/``grace`` in seconds; ``options`` holds the kind's own keys."""

    name: str
    kind: str
    period: float
    grace: float
    runbook: str
    silences: tuple[Window, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def silenced_at(self, when: float) -> Window | None:
        return next((w for w in self.silences if w.covers(when)), None)


@dataclass(frozen=True)
class AlertConfig:
    webhook_url: str | None = None
    smtp_url: str | None = None  # smtp://host:port
    email_from: str = "onceflow-watchdog@localhost"
    email_to: tuple[str, ...] = ()
    reminder_seconds: float = 3600.0
    send_timeout: float = 5.0
    max_attempts: int = 8
    backoff_seconds: float = 2.0
    backoff_max_seconds: float = 300.0


@dataclass(frozen=True)
class WatchdogConfig:
    ledger_url: str
    state_dir: Path
    loop_seconds: float
    runbook_base: str
    replica: str
    self_heartbeat_url: str | None
    alerts: AlertConfig
    checks: tuple[CheckConfig, ...]
    warehouse_url: str | None = None
    source: str = "<memory>"


_TOP = {
    "ledger_url",
    "warehouse_url",
    "state_dir",
    "loop_seconds",
    "runbook_base",
    "replica",
    "self_heartbeat",
    "alerts",
    "checks",
}
_ALERT_KEYS = {
    "webhook_url",
    "smtp_url",
    "email_from",
    "email_to",
    "reminder_seconds",
    "send_timeout_seconds",
    "max_attempts",
    "backoff_seconds",
    "backoff_max_seconds",
}
_COMMON = {"kind", "period_seconds", "grace_seconds", "runbook", "silences", "enabled"}
_KIND_KEYS: dict[str, set[str]] = {
    "heartbeat": {"max_lag_seconds"},
    "api_health": {"url", "timeout_seconds"},
    "business_freshness": {"table", "deadline_cron", "timezone", "partition_offset_days"},
    "sheet_queue": {"endpoint", "spreadsheet_id", "range", "credentials_file", "max_age_seconds"},
    "article_queue": {"max_age_seconds"},
}


def load_config(path: str | Path) -> WatchdogConfig:
    """Read and validate ``path``; raises :class:`ConfigError` naming the first bad key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:  # a binary or Latin-1 file is unreadable too
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], *, source: str = "<memory>") -> WatchdogConfig:
    _unknown(raw, _TOP, "")
    ledger_url = _sql_url(raw, "ledger_url", required=True)
    assert ledger_url is not None
    warehouse_url = _sql_url(raw, "warehouse_url", required=False)
    state_dir = Path(_str(raw, "state_dir", default=".onceflow-watchdog"))
    loop = _seconds(raw, "loop_seconds", 15.0, positive=True)
    runbook_base = _str(raw, "runbook_base", default="docs/watchdog.md")
    replica = _str(raw, "replica", default="")
    self_hb = raw.get("self_heartbeat", {})
    _table(self_hb, "self_heartbeat")
    _unknown(self_hb, {"url"}, "self_heartbeat.")
    self_url = _http_url(self_hb, "url", "self_heartbeat.")
    alerts = _alerts(raw.get("alerts", {}))
    checks_raw = raw.get("checks", {})
    _table(checks_raw, "checks")
    checks = []
    for name, body in checks_raw.items():
        _table(body, f"checks.{name}")
        enabled = body.get("enabled", True)
        if not isinstance(enabled, bool):  # "no" or 0 would otherwise silently mean "on"
            raise ConfigError(f"checks.{name}.enabled: expected true or false, got {enabled!r}")
        if not enabled:
            continue
        checks.append(_check(name, body, runbook_base))
    if not checks:
        raise ConfigError("checks: at least one [checks.<name>] table is needed")
    if any(c.kind == "business_freshness" for c in checks) and warehouse_url is None:
        raise ConfigError("warehouse_url: required by a business_freshness check (where load_audit lives)")
    return WatchdogConfig(
        ledger_url=ledger_url,
        state_dir=state_dir,
        loop_seconds=loop,
        runbook_base=runbook_base,
        replica=replica,
        self_heartbeat_url=self_url,
        alerts=alerts,
        checks=tuple(checks),
        warehouse_url=warehouse_url,
        source=source,
    )


def _alerts(raw: Any) -> AlertConfig:
    _table(raw, "alerts")
    _unknown(raw, _ALERT_KEYS, "alerts.")
    webhook = _http_url(raw, "webhook_url", "alerts.")
    smtp = raw.get("smtp_url")
    if smtp is not None:
        parts = urlsplit(str(smtp))
        try:
            parts.port  # noqa: B018 -- raises on a port that is not a number (smtp://h:twenty-five)
        except ValueError:
            parts = urlsplit("")
        if parts.scheme != "smtp" or not parts.hostname:
            raise ConfigError(f"alerts.smtp_url: unsupported URL {smtp!r} (expected smtp://host:port)")
    to = raw.get("email_to", [])
    if isinstance(to, str):
        to = [to]
    if not isinstance(to, list) or not all(isinstance(t, str) and "@" in t for t in to):
        raise ConfigError(f"alerts.email_to: expected a list of e-mail addresses, got {to!r}")
    if smtp and not to:
        raise ConfigError("alerts.email_to: required when alerts.smtp_url is set")
    attempts = raw.get("max_attempts", 8)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ConfigError(f"alerts.max_attempts: expected an integer >= 1, got {attempts!r}")
    return AlertConfig(
        webhook_url=webhook,
        smtp_url=smtp,
        email_from=_str(raw, "email_from", default="onceflow-watchdog@localhost", prefix="alerts."),
        email_to=tuple(to),
        reminder_seconds=_seconds(raw, "reminder_seconds", 3600.0, prefix="alerts.", positive=True),
        send_timeout=_seconds(raw, "send_timeout_seconds", 5.0, prefix="alerts.", positive=True),
        max_attempts=attempts,
        backoff_seconds=_seconds(raw, "backoff_seconds", 2.0, prefix="alerts."),
        backoff_max_seconds=_seconds(raw, "backoff_max_seconds", 300.0, prefix="alerts."),
    )


def _check(name: str, raw: dict[str, Any], runbook_base: str) -> CheckConfig:
    p = f"checks.{name}."
    kind = raw.get("kind", name)
    if kind not in CHECK_KINDS:
        raise ConfigError(f"{p}kind: unknown check kind {kind!r} (one of {', '.join(CHECK_KINDS)})")
    _unknown(raw, _COMMON | _KIND_KEYS[kind], p)
    period = _seconds(raw, "period_seconds", 60.0, prefix=p, positive=True)
    grace = _seconds(raw, "grace_seconds", 60.0, prefix=p)
    options: dict[str, Any] = {}
    if kind == "heartbeat":
        options["max_lag"] = _seconds(raw, "max_lag_seconds", 30.0, prefix=p, positive=True)
    elif kind == "api_health":
        url = _http_url(raw, "url", p)
        if url is None:
            raise ConfigError(f"{p}url: required for an api_health check")
        options["url"] = url
        options["timeout"] = _seconds(raw, "timeout_seconds", 5.0, prefix=p, positive=True)
    elif kind == "business_freshness":
        options["table"] = _str(raw, "table", default="daily_sales", prefix=p)
        tz_name = _str(raw, "timezone", default="UTC", prefix=p)
        try:
            options["timezone"] = ZoneInfo(tz_name)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(f"{p}timezone: unknown timezone {tz_name!r}") from exc
        cron = _str(raw, "deadline_cron", default="0 7 * * *", prefix=p)
        from croniter import croniter

        if not croniter.is_valid(cron):
            raise ConfigError(f"{p}deadline_cron: bad cron expression {cron!r}")
        options["deadline_cron"] = cron
        offset = raw.get("partition_offset_days", 1)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"{p}partition_offset_days: expected an integer >= 0, got {offset!r}")
        options["partition_offset_days"] = offset
    elif kind == "sheet_queue":
        for key in ("endpoint", "spreadsheet_id"):
            if key not in raw:
                raise ConfigError(f"{p}{key}: required for a sheet_queue check")
        endpoint = _http_url(raw, "endpoint", p)
        options.update(
            endpoint=endpoint,
            spreadsheet_id=_str(raw, "spreadsheet_id", default="", prefix=p),
            range=_str(raw, "range", default="Queue!A:Z", prefix=p),
            # Not str(): an integer would be opened as a file descriptor (the watchdog's own DB).
            credentials_file=_optional_str(raw, "credentials_file", p),
            max_age=_seconds(raw, "max_age_seconds", 3600.0, prefix=p, positive=True),
        )
    elif kind == "article_queue":
        options["max_age"] = _seconds(raw, "max_age_seconds", 3600.0, prefix=p, positive=True)
    runbook = _str(raw, "runbook", default=f"{runbook_base}#check-{kind.replace('_', '-')}", prefix=p)
    silences = tuple(_window(w, f"{p}silences[{i}]") for i, w in enumerate(raw.get("silences", [])))
    return CheckConfig(name, kind, period, grace, runbook, silences, options)


def _window(raw: Any, where: str) -> Window:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table with start, end, reason; got {raw!r}")
    _unknown(raw, {"start", "end", "reason"}, f"{where}.")
    bounds = []
    for key in ("start", "end"):
        value = raw.get(key)
        if not isinstance(value, dt.datetime) or value.tzinfo is None:
            raise ConfigError(
                f"{where}.{key}: expected an offset date-time (2026-12-01T02:00:00Z), got {value!r}"
            )
        bounds.append(value.timestamp())
    if bounds[1] <= bounds[0]:
        raise ConfigError(f"{where}.end: {raw['end']!r} is not after start {raw['start']!r}")
    return Window(bounds[0], bounds[1], str(raw.get("reason", "maintenance")))


def _table(value: Any, key: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table, got {value!r}")


def _unknown(raw: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(
                f"{prefix}{key}: unknown key (value {raw[key]!r}); allowed: {', '.join(sorted(allowed))}"
            )


def _str(raw: dict[str, Any], key: str, *, default: str, prefix: str = "") -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{prefix}{key}: expected a string, got {value!r}")
    return value


def _optional_str(raw: dict[str, Any], key: str, prefix: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{prefix}{key}: expected a string, got {value!r}")
    return value


def _seconds(
    raw: dict[str, Any], key: str, default: float, *, prefix: str = "", positive: bool = False
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        # nan or inf would never be exceeded: a check that can never go down.
        raise ConfigError(f"{prefix}{key}: expected a finite number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{prefix}{key}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _http_url(raw: dict[str, Any], key: str, prefix: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    parts = urlsplit(str(value))
    if parts.scheme not in HTTP_SCHEMES or not parts.netloc:
        raise ConfigError(f"{prefix}{key}: unsupported URL scheme in {value!r} (expected http or https)")
    return str(value)


def _sql_url(raw: dict[str, Any], key: str, *, required: bool) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{key}: required (a SQLAlchemy URL of the ledger database)")
        return None
    if not isinstance(value, str) or value.split(":", 1)[0].split("+", 1)[0] not in SQL_SCHEMES:
        raise ConfigError(f"{key}: unsupported URL scheme in {value!r} (expected postgresql or sqlite)")
    return value
