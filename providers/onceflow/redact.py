"""The one place that hides secrets before text leaves the process (logs, errors, ledger rows, alerts).

Every URL, DSN or token that onceflow formats into an error message, a log line, a ledger row, an
alert or a sheet cell goes through this module. The API is four names:

- :func:`redact_url` (one URL or DSN) hides
    * the password of the user-info (``postgres://watchdog:***@db/ledger``), and a user name that
      looks like a token when there is no password (``https://***@sentry.example/1``);
    * the values of query parameters whose name says secret (``password``, ``token``, ``key``,
      ``secret``, ``sig``, ``auth``, ... : ``?password=***``);
    * the secret path segments of known webhook and ping formats: Slack
      ``/services/T../B../***`` and ``/workflows/.../***``, healthchecks ``/ping/***`` (the UUID,
      or the ping key and slug), Discord ``/api/webhooks/<id>/***``, Microsoft Teams
      ``/webhookb2/***``, and any segment that looks like a generated token (24+ characters of
      letters and digits, with both);
  the scheme, host, port and the rest of the path stay, so the reader still sees where it went.
- :func:`redact_text` (free text, such as ``repr(exc)``) applies :func:`redact_url` to every URL
  in it, hides ``password=...``-style pairs (libpq key-value DSNs), and replaces every literal
  registered with :func:`register_secret`.
- :func:`register_secret` remembers a literal secret (a webhook URL from the config, a ping URL
  from the environment) for :func:`redact_text`, and with ``airflow=True`` also hands it to
  Airflow's secrets masker so task logs hide it (Airflow only masks the connections and variables
  it reads itself, not a value our code takes from ``os.environ``).
- :class:`RedactingFilter` is a :class:`logging.Filter` that passes every record's message through
  :func:`redact_text`: a safety net for handlers, not a replacement for redacting at the source.

What it does not do: it cannot know an arbitrary secret in an arbitrary path; register those.
The placeholder is ``***``, as Airflow's masker uses.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import SplitResult, parse_qsl, unquote_plus, urlsplit

__all__ = ["MASK", "RedactingFilter", "redact_text", "redact_url", "register_secret"]

MASK = "***"

# Query parameter names whose values are credentials (compared lower-cased, '-' read as '_').
_SECRET_PARAMS = re.compile(
    r"(pass|pwd|secret|token|key|sig|signature|auth|credential|session|code|apikey|private)",
)
# A generated token: long, only URL-safe characters, letters and digits both present.
_TOKENISH = re.compile(r"^(?=.*[A-Za-z])(?=.*\d)[A-Za-z0-9_\-.~=%]{24,}$")
# Path prefixes after which every remaining segment is a secret (healthchecks pings, Teams).
_SECRET_AFTER = ("ping", "webhookb2", "hooks", "triggers")
# Slack: /services/T.../B.../<token>; /workflows/T.../A.../<id>/<token>. Keep the ids, hide the rest.
_SLACK = re.compile(r"^(/services/[^/]+/[^/]+/|/workflows/[^/]+/[^/]+/[^/]+/)(.+)$")
# Discord and similar: /api/webhooks/<id>/<token>.
_DISCORD = re.compile(r"^(/api/webhooks/[^/]+/)(.+)$")
# A URL in free text: a scheme, '://', then anything up to whitespace or a quote or bracket.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
# key=value credentials outside URLs: libpq "password=x", "api_key: x", JSON "password": "x".
# Not a bare "token": fencing tokens are logged on purpose ("token=3").
_KV_IN_TEXT = re.compile(
    r"""(?ix)
    (\b(?:password|passwd|pwd|secret|client[_-]?secret|api[_-]?key|access[_-]?key|access[_-]?token|auth[_-]?token)\b["']?\s*[=:]\s*["']?)
    ([^\s"'&,;}]+)
    """
)

# user:password@ after "://", wherever it is (also where urlsplit does not find a user-info).
_USERINFO = re.compile(r"(://[^/\s:@]*:)[^@\s/]*@")

_registered: set[str] = set()
_lock = threading.Lock()


def redact_url(url: str) -> str:
    """``url`` with its credentials replaced by ``***`` (see the module docstring for which parts).

    Never raises: a string that does not parse as a URL is returned through :func:`_redact_plain`
    (which still hides registered secrets and ``password=`` pairs), because the caller is usually
    formatting an error about that very string.
    """
    try:
        parts = urlsplit(url)
        netloc = _redact_netloc(parts)
        path = _redact_path(parts.path)
        query = _redact_query(parts.query)
    except ValueError:  # e.g. an unbalanced '[' in the host: still hide what we can
        return _redact_plain(url)
    if (netloc, path, query) != (parts.netloc, parts.path, parts.query):
        url = _join(parts, netloc, path, query)
    # user:password@ that urlsplit did not see as user-info ("://u:pw@h" with no scheme)
    return _replace_registered(_USERINFO.sub(rf"\g<1>{MASK}@", url))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted, ``password=``-style pairs hidden, and registered
    secrets replaced. Safe on any string, including ``repr()`` of an exception."""
    text = _replace_registered(text)
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    text = _USERINFO.sub(rf"\g<1>{MASK}@", text)
    return _KV_IN_TEXT.sub(lambda m: m.group(1) + MASK, text)


def register_secret(secret: str | None, *, airflow: bool = False) -> None:
    """Remember ``secret`` so :func:`redact_text` (and :func:`redact_url`) replace it wherever it
    appears; with ``airflow=True`` also mask it in Airflow task logs. Empty values are ignored.

    A URL is registered together with its redacted form's secret parts: the whole URL, and the
    pieces :func:`redact_url` would hide (so a message quoting only the path is covered too).
    """
    if not secret or len(secret) < 4:  # masking "a" or "" would garble every line
        return
    pieces = {secret}
    if "://" in secret:
        pieces |= _secret_pieces(secret)
    with _lock:
        _registered.update(p for p in pieces if len(p) >= 4)
    if airflow:
        _mask_in_airflow(secret)


class RedactingFilter(logging.Filter):
    """Rewrites each record's message through :func:`redact_text` (attach to a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return True
        redacted = redact_text(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        return True


def _redact_netloc(parts: SplitResult) -> str:
    netloc = parts.netloc
    if "@" not in netloc:
        return netloc
    userinfo, _, hostport = netloc.rpartition("@")
    user, has_password, _ = userinfo.partition(":")
    if has_password:
        return f"{user}:{MASK}@{hostport}"
    if _TOKENISH.match(user) or len(user) >= 32:
        return f"{MASK}@{hostport}"
    return netloc


def _redact_path(path: str) -> str:
    if not path:
        return path
    for pattern in (_SLACK, _DISCORD):
        m = pattern.match(path)
        if m:
            return m.group(1) + MASK
    segments = path.split("/")
    for i, seg in enumerate(segments):
        if seg.lower() in _SECRET_AFTER and any(segments[i + 1 :]):
            return "/".join([*segments[: i + 1], MASK])
    return "/".join(MASK if _TOKENISH.match(seg) else seg for seg in segments)


def _redact_query(query: str) -> str:
    if not query:
        return query
    out = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        plain_name = unquote_plus(name).lower().replace("-", "_")
        if eq and value and (_SECRET_PARAMS.search(plain_name) or _TOKENISH.match(unquote_plus(value))):
            pair = f"{name}={MASK}"
        out.append(pair)
    return "&".join(out)


def _join(parts: SplitResult, netloc: str, path: str, query: str) -> str:
    # By hand, not urlunsplit: that drops the empty authority of "sqlite:////tmp/x".
    out = f"{parts.scheme}://{netloc}{path}" if parts.scheme else f"//{netloc}{path}"
    if query:
        out += f"?{query}"
    if parts.fragment:
        out += f"#{parts.fragment}"
    return out


def _redact_plain(text: str) -> str:
    text = _USERINFO.sub(rf"\g<1>{MASK}@", _replace_registered(text))
    return _KV_IN_TEXT.sub(lambda m: m.group(1) + MASK, text)


def _secret_pieces(url: str) -> set[str]:
    """The substrings of ``url`` that :func:`redact_url` would hide (for literal replacement)."""
    pieces: set[str] = set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return pieces
    if parts.password:
        pieces.add(parts.password)
    redacted = _redact_path(parts.path)
    if redacted != parts.path:
        keep = redacted[: -len(MASK)] if redacted.endswith(MASK) else ""
        if keep and parts.path.startswith(keep):
            pieces.add(parts.path[len(keep) :])
        pieces |= {s for s in parts.path.split("/") if _TOKENISH.match(s)}
    for name, value in parse_qsl(parts.query):
        if value and (_SECRET_PARAMS.search(name.lower()) or _TOKENISH.match(value)):
            pieces.add(value)
    return pieces


def _replace_registered(text: str) -> str:
    with _lock:
        secrets = sorted(_registered, key=len, reverse=True)  # longest first: a URL before its token
    for s in secrets:
        if s in text:
            text = text.replace(s, _registered_replacement(s))
    return text


def _registered_replacement(secret: str) -> str:
    """A registered URL keeps its scheme and host (the reader sees where it went); all else goes."""
    if "://" not in secret:
        return MASK
    try:
        parts = urlsplit(secret)
        return _join(parts, _redact_netloc(parts), "/" + MASK, "")
    except ValueError:
        return MASK


def _mask_in_airflow(secret: str) -> None:
    # Lazy: the watchdog and the CLI import this module without starting Airflow's logging.
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - Airflow < 3.1 is not supported; nothing to mask with
        return
    mask_secret(secret)
    for piece in _secret_pieces(secret) if "://" in secret else ():
        mask_secret(piece)
