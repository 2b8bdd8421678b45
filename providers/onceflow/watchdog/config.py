"""The watchdog's TOML configuration: pydantic models of the file, validated before anything runs.

::

    ledger_url = "postgresql+psycopg2://watchdog@db/ledger"
    state_dir = "/var/lib/onceflow-watchdog"

    [alerts]
    webhook_url = "https://hooks.slack.com/services/..."

    [checks.heartbeat]
    period_seconds = 60
    grace_seconds = 120

The models (:class:`WatchdogFile` and the classes it names) describe every key, its type, range
and default, and give the reference table in ``docs/watchdog.md``. :func:`load_config` turns
every wrong input into one :class:`ConfigError` whose lines each name a key (dotted path) and its
value, with secrets redacted (:mod:`onceflow.redact`): a DSN's password, a webhook's token. The
value of an *unknown* key is never shown (a mistyped ``webhook_ulr`` holds the token). The
runtime objects (:class:`WatchdogConfig`, :class:`CheckConfig`, :class:`AlertConfig`) are plain
frozen dataclasses built from the validated models.
"""

from __future__ import annotations

import datetime as dt
import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from onceflow.redact import redact_text, redact_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib

CHECK_KINDS = ("heartbeat", "api_health", "business_freshness", "sheet_queue", "article_queue")
#: Keys whose values may hold a credential: shown redacted in errors.
_SECRET_KEYS = frozenset({"ledger_url", "warehouse_url", "webhook_url", "smtp_url", "url", "endpoint"})
_YEAR = 366 * 86400.0


class ConfigError(ValueError):
    """The configuration is unusable; the message names the key and the value (secrets redacted)."""


# -- field types -----------------------------------------------------------------------------


def _http_url(value: str) -> str:
    return _url(value, ("http", "https"), "http or https")


def _smtp_url(value: str) -> str:
    return _url(value, ("smtp",), "smtp://host:port")


def _url(value: str, schemes: tuple[str, ...], expected: str) -> str:
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}; expected {expected})") from None
    if parts.scheme not in schemes:
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} (expected {expected})")
    if not parts.hostname:
        raise ValueError("the URL has no host")
    if port == 0:
        raise ValueError("port 0 is not a port to send to")
    return value


def _sql_url(value: str) -> str:
    import sqlalchemy as sa

    scheme = value.split(":", 1)[0]
    backend = scheme.split("+", 1)[0]
    if backend not in ("postgresql", "sqlite"):
        hint = " (did you mean postgresql?)" if backend in ("postgres", "psql", "pg") else ""
        raise ValueError(f"unsupported URL scheme {scheme!r}{hint} (expected postgresql or sqlite)")
    try:
        sa.engine.make_url(value).get_dialect().import_dbapi()
    except Exception as exc:  # unknown driver (postgresql+nope), or its module is not installed
        raise ValueError(
            f"unknown or unavailable database driver {scheme!r} ({type(exc).__name__})"
        ) from None
    return value


def _timezone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("unknown timezone") from None
    return value


def _cron(value: str) -> str:
    from croniter import croniter

    if not croniter.is_valid(value):
        raise ValueError("bad cron expression")
    return value


def _aware(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        raise ValueError("expected an offset date-time (2026-12-01T02:00:00Z), not a local one")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
SqlUrl = Annotated[str, AfterValidator(_sql_url)]
Seconds = Annotated[float, Field(ge=0, le=_YEAR, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0, le=_YEAR, allow_inf_nan=False)]
AwareDatetime = Annotated[dt.datetime, AfterValidator(_aware)]


class _Model(BaseModel):
    # strict: "5" is not a number and 0 is not false; forbid: a typo is an error, not a default.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# -- the file --------------------------------------------------------------------------------


class SilenceWindow(_Model):
    """A silence or maintenance window: the check's down alert is held while it covers it."""

    start: AwareDatetime = Field(description="Start, an offset date-time (`2026-12-01T02:00:00Z`).")
    end: AwareDatetime = Field(description="End (exclusive); after `start`.")
    reason: str = Field("maintenance", description="Why, for the record.", max_length=500)

    @model_validator(mode="after")
    def _ordered(self) -> SilenceWindow:
        if self.end <= self.start:
            raise ValueError(f"end {self.end.isoformat()} is not after start {self.start.isoformat()}")
        return self


class _CheckBase(_Model):
    enabled: bool = Field(True, description="`false` skips the check.")
    period_seconds: PositiveSeconds = Field(60.0, description="How often the evidence must renew.")
    grace_seconds: Seconds = Field(60.0, description="Late for this long after the period, then down.")
    runbook: str | None = Field(None, description="Runbook link; default `<runbook_base>#check-<kind>`.")
    silences: list[SilenceWindow] = Field(default_factory=list, description="Silence windows.")
    flap_threshold: int = Field(
        4,
        ge=0,
        le=1000,
        description="More down transitions than this within `flap_window_seconds`: "
        "held as flapping (one message; a down is held at most period + grace), 0 = never.",
    )
    flap_window_seconds: PositiveSeconds = Field(3600.0, description="The flap-counting window.")


class HeartbeatCheck(_CheckBase):
    """The `heartbeat` DAG's beats in `onceflow_heartbeats`."""

    kind: Literal["heartbeat"] = "heartbeat"
    max_lag_seconds: PositiveSeconds = Field(30.0, description="A beat started later than this: late.")
    dag_id: str | None = Field(
        None, description="Only beats of this DAG id; none: any (the `heartbeat` DAG)."
    )


class ApiHealthCheck(_CheckBase):
    """Airflow's `/api/v2/monitor/health` (recorded, never trusted alone)."""

    kind: Literal["api_health"]
    url: HttpUrl = Field(description="The health endpoint.")
    timeout_seconds: PositiveSeconds = Field(5.0, description="Total deadline of the GET.")


class BusinessFreshnessCheck(_CheckBase):
    """A table's `load_audit` partitions against a business deadline."""

    kind: Literal["business_freshness"]
    table: str = Field("daily_sales", description="The table in `load_audit`.", min_length=1)
    deadline_cron: Annotated[str, AfterValidator(_cron)] = Field(
        "0 7 * * *", description="When each partition is due, cron in `timezone`."
    )
    timezone: Annotated[str, AfterValidator(_timezone)] = Field("UTC", description="The business timezone.")
    partition_offset_days: int = Field(1, ge=0, le=366, description="Partition due = deadline's date - this.")


class SheetQueueCheck(_CheckBase):
    """The oldest NEW row of the sheet queue."""

    kind: Literal["sheet_queue"]
    endpoint: HttpUrl = Field(description="Sheets API endpoint (or the emulator's).")
    spreadsheet_id: str = Field(description="The spreadsheet.", min_length=1)
    range: str = Field("Queue!A:Z", description="A1 range with the header row.")
    credentials_file: str | None = Field(None, description="Service account JSON; none: anonymous.")
    max_age_seconds: PositiveSeconds = Field(3600.0, description="A NEW row older than this: late.")


class ArticleQueueCheck(_CheckBase):
    """The oldest claimed, unfinished article in the ledger."""

    kind: Literal["article_queue"]
    max_age_seconds: PositiveSeconds = Field(3600.0, description="An article older than this: late.")


AnyCheck = Annotated[
    HeartbeatCheck | ApiHealthCheck | BusinessFreshnessCheck | SheetQueueCheck | ArticleQueueCheck,
    Field(discriminator="kind"),
]


class SelfHeartbeatSection(_Model):
    """Who watches the watchdog: a URL pinged at the start of every pass."""

    url: HttpUrl | None = Field(None, description="A healthchecks.io check URL (kept secret in logs).")


class AlertsSection(_Model):
    """Where alerts go, and how delivery retries, groups and times out."""

    webhook_url: HttpUrl | None = Field(None, description="Slack-compatible incoming webhook.")
    smtp_url: Annotated[str, AfterValidator(_smtp_url)] | None = Field(
        None, description="`smtp://[user:password@]host:port`."
    )
    email_from: str = Field("onceflow-watchdog@localhost", description="From address.")
    email_to: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$")]] = Field(
        default_factory=list, description="Recipients; required with `smtp_url`."
    )
    reminder_seconds: PositiveSeconds = Field(3600.0, description="Remind while down, this often.")
    send_timeout_seconds: Annotated[float, Field(gt=0, le=120, allow_inf_nan=False)] = Field(
        5.0, description="Total deadline of one send (webhook or SMTP); the lease is this + 5 s."
    )
    max_attempts: int = Field(8, ge=1, le=10000, description="Failures before the CRITICAL log line.")
    backoff_seconds: Seconds = Field(2.0, description="First retry delay; doubles each failure.")
    backoff_max_seconds: Seconds = Field(300.0, description="Longest retry delay.")
    group_wait_seconds: Seconds = Field(0.0, description="Hold a down alert this long to group it.")
    group_max: int = Field(50, ge=1, le=1000, description="Most down alerts in one grouped message.")
    log_only: bool = Field(
        False,
        description="No channel on purpose (a demo): alerts are CRITICAL log lines only. Without it, "
        "a config with neither `webhook_url` nor `smtp_url` is refused.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_recipient(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("email_to"), str):
            data = {**data, "email_to": [data["email_to"]]}
        return data

    @model_validator(mode="after")
    def _some_channel(self) -> AlertsSection:
        if not self.webhook_url and not self.smtp_url and not self.log_only:
            raise ValueError(
                "no alert channel: set webhook_url or smtp_url (a down check must page someone), "
                "or log_only = true to mean it"
            )
        if self.smtp_url and not self.email_to:
            raise ValueError("email_to is required when smtp_url is set")
        return self


class StatusSection(_Model):
    """The status API over HTTP (the same JSON as `onceflow-watchdog status`)."""

    port: int | None = Field(None, ge=1, le=65535, description="Serve on 127.0.0.1:<port>; none: off.")
    flips: int = Field(20, ge=0, le=1000, description="How many recent flips to list per check.")


class WatchdogFile(_Model):
    """The whole TOML file."""

    ledger_url: SqlUrl = Field(description="SQLAlchemy URL of the ledger database (postgresql or sqlite).")
    warehouse_url: SqlUrl | None = Field(
        None, description="Where `load_audit` lives; for business_freshness."
    )
    state_dir: str = Field(".onceflow-watchdog", description="This replica's SQLite file (blindness).")
    loop_seconds: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = Field(
        15.0, description="Time between passes."
    )
    pass_budget_seconds: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = Field(
        None, description="A pass running longer is a blindness incident; default 2 x loop + 30 s."
    )
    statement_timeout_seconds: Annotated[float, Field(gt=0, le=600, allow_inf_nan=False)] = Field(
        10.0, description="Deadline of each database call (PostgreSQL statement, lock, connect, pool)."
    )
    runbook_base: str = Field("docs/watchdog.md", description="Base of the runbook links.")
    replica: str = Field("", description="This replica's name; default host:pid.", max_length=200)
    self_heartbeat: SelfHeartbeatSection = Field(
        default_factory=lambda: SelfHeartbeatSection.model_validate({}),
        description="The `[self_heartbeat]` table.",
    )
    alerts: AlertsSection = Field(description="The `[alerts]` table.")
    status: StatusSection = Field(
        default_factory=lambda: StatusSection.model_validate({}), description="The `[status]` table."
    )
    checks: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,100}$")], AnyCheck] = Field(
        description="`[checks.<name>]` tables; `kind` defaults to the name."
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_from_name(cls, data: Any) -> Any:
        checks = data.get("checks") if isinstance(data, dict) else None
        if isinstance(checks, dict):
            data = {
                **data,
                "checks": {
                    name: ({"kind": name, **body} if isinstance(body, dict) and "kind" not in body else body)
                    for name, body in checks.items()
                },
            }
        return data

    @model_validator(mode="after")
    def _consistent(self) -> WatchdogFile:
        if not any(c.enabled for c in self.checks.values()):
            raise ValueError("checks: at least one enabled [checks.<name>] table is needed")
        if self.warehouse_url is None and any(
            c.kind == "business_freshness" and c.enabled for c in self.checks.values()
        ):
            raise ValueError("warehouse_url: required by a business_freshness check (where load_audit lives)")
        return self


# -- runtime objects -------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A silence or maintenance window: alerts for the check are held back, transitions still recorded."""

    start: float
    end: float
    reason: str

    def covers(self, when: float) -> bool:
        """Whether the window covers the time ``when``."""
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
    flap_threshold: int = 0
    flap_window: float = 3600.0

    def silenced_at(self, when: float) -> Window | None:
        """The silence window covering ``when``, or ``None``."""
        return next((w for w in self.silences if w.covers(when)), None)


@dataclass(frozen=True)
class AlertConfig:
    """Where alerts go (webhook, SMTP), how often reminders repeat, and how sending is retried."""

    webhook_url: str | None = None
    smtp_url: str | None = None  # smtp://host:port
    email_from: str = "onceflow-watchdog@localhost"
    email_to: tuple[str, ...] = ()
    reminder_seconds: float = 3600.0
    send_timeout: float = 5.0
    max_attempts: int = 8
    backoff_seconds: float = 2.0
    backoff_max_seconds: float = 300.0
    group_wait_seconds: float = 0.0
    group_max: int = 50


@dataclass(frozen=True)
class WatchdogConfig:
    """The whole validated configuration of one watchdog."""

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
    pass_budget_seconds: float | None = None
    statement_timeout: float = 10.0
    status_port: int | None = None
    status_flips: int = 20

    @property
    def pass_budget(self) -> float:
        """Longest a pass may run before it is itself a blindness incident."""
        return self.pass_budget_seconds or self.loop_seconds * 2 + 30


# -- loading ---------------------------------------------------------------------------------


def load_config(path: str | Path) -> WatchdogConfig:
    """Read and validate ``path``; raises :class:`ConfigError` naming each bad key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:  # a binary or Latin-1 file is unreadable too
        raise ConfigError(f"cannot read config file {str(path)!r}: {type(exc).__name__}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], *, source: str = "<memory>") -> WatchdogConfig:
    """Validate a parsed TOML document; raises :class:`ConfigError` naming each bad key."""
    try:
        model = WatchdogFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, raw)) from None
    except (OverflowError, RecursionError) as exc:  # an integer of 320 digits where a float belongs
        raise ConfigError(f"a number is out of range ({exc})") from None
    return _runtime(model, source)


def format_errors(exc: ValidationError, raw: Any) -> str:
    """One line per error: ``dotted.key: message (got <value, redacted>)``."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        if len(loc) > 2 and loc[0] == "checks" and loc[2] in CHECK_KINDS:
            del loc[2]  # pydantic puts the union's tag (the check kind) into the location
        key = ".".join(loc) or "(file)"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(raw, loc[:-1])
            hint = difflib.get_close_matches(loc[-1], allowed, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(f"{key}: unknown key{did}; its value is not shown; allowed: {', '.join(allowed)}")
            continue
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            kind = err.get("ctx", {}).get("tag", "?")
            lines.append(f"{key}.kind: unknown check kind {kind!r} (one of {', '.join(CHECK_KINDS)})")
            continue
        if err["type"] == "missing":
            lines.append(f"{key}: required")
            continue
        lines.append(f"{key}: {redact_text(message)} (got {_shown(loc, err.get('input'))})")
    return "\n".join(lines)


def _shown(loc: list[str], value: Any) -> str:
    if isinstance(value, dict):  # a table: its values may hold secrets, and the key says where
        return f"a table with keys {', '.join(map(str, value))}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, str) and (any(part in _SECRET_KEYS for part in loc) or "://" in value):
        return repr(redact_url(value))
    text = repr(value)
    return redact_text(text if len(text) <= 200 else text[:199] + "…")


def _allowed_keys(raw: Any, loc: list[str]) -> list[str]:
    model: type[BaseModel] = WatchdogFile
    node = raw
    for part in loc:
        node = node.get(part) if isinstance(node, dict) else None
        if part == "checks" and model is WatchdogFile:
            continue
        if model is WatchdogFile and loc and loc[0] == "checks":
            kind = node.get("kind", part) if isinstance(node, dict) else part
            model = _KIND_MODELS.get(kind, HeartbeatCheck)
            continue
        annotation = model.model_fields.get(part)
        sub = getattr(annotation, "annotation", None)
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            model = sub
    return sorted(model.model_fields)


_KIND_MODELS: dict[str, type[BaseModel]] = {
    "heartbeat": HeartbeatCheck,
    "api_health": ApiHealthCheck,
    "business_freshness": BusinessFreshnessCheck,
    "sheet_queue": SheetQueueCheck,
    "article_queue": ArticleQueueCheck,
}


def _runtime(model: WatchdogFile, source: str) -> WatchdogConfig:
    a = model.alerts
    alerts = AlertConfig(
        webhook_url=a.webhook_url,
        smtp_url=a.smtp_url,
        email_from=a.email_from,
        email_to=tuple(a.email_to),
        reminder_seconds=a.reminder_seconds,
        send_timeout=a.send_timeout_seconds,
        max_attempts=a.max_attempts,
        backoff_seconds=a.backoff_seconds,
        backoff_max_seconds=a.backoff_max_seconds,
        group_wait_seconds=a.group_wait_seconds,
        group_max=a.group_max,
    )
    checks = tuple(
        _check(name, body, model.runbook_base) for name, body in model.checks.items() if body.enabled
    )
    return WatchdogConfig(
        ledger_url=model.ledger_url,
        state_dir=Path(model.state_dir),
        loop_seconds=model.loop_seconds,
        runbook_base=model.runbook_base,
        replica=model.replica,
        self_heartbeat_url=model.self_heartbeat.url,
        alerts=alerts,
        checks=checks,
        warehouse_url=model.warehouse_url,
        source=source,
        pass_budget_seconds=model.pass_budget_seconds,
        statement_timeout=model.statement_timeout_seconds,
        status_port=model.status.port,
        status_flips=model.status.flips,
    )


def _check(name: str, c: Any, runbook_base: str) -> CheckConfig:
    options: dict[str, Any] = {}
    if isinstance(c, HeartbeatCheck):
        options["max_lag"] = c.max_lag_seconds
        options["dag_id"] = c.dag_id
    elif isinstance(c, ApiHealthCheck):
        options.update(url=c.url, timeout=c.timeout_seconds)
    elif isinstance(c, BusinessFreshnessCheck):
        options.update(
            table=c.table,
            timezone=ZoneInfo(c.timezone),
            deadline_cron=c.deadline_cron,
            partition_offset_days=c.partition_offset_days,
        )
    elif isinstance(c, SheetQueueCheck):
        options.update(
            endpoint=c.endpoint,
            spreadsheet_id=c.spreadsheet_id,
            range=c.range,
            credentials_file=c.credentials_file,
            max_age=c.max_age_seconds,
        )
    elif isinstance(c, ArticleQueueCheck):
        options["max_age"] = c.max_age_seconds
    silences = tuple(Window(w.start.timestamp(), w.end.timestamp(), w.reason) for w in c.silences)
    runbook = c.runbook or f"{runbook_base}#check-{c.kind.replace('_', '-')}"
    return CheckConfig(
        name,
        c.kind,
        c.period_seconds,
        c.grace_seconds,
        runbook,
        silences,
        options,
        flap_threshold=c.flap_threshold,
        flap_window=c.flap_window_seconds,
    )
