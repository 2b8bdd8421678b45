"""Stable identity of an article: URL normalisation, row key and deterministic run id.

The row key depends only on the normalised URL, never on the row's position, so it survives the
editor sorting, inserting and deleting rows. The run id adds the processing version, so Airflow's
metadata database refuses a second ``article_pipeline`` run for the same article and version.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlsplit, urlunsplit

FORMULA_PREFIXES = ("=", "+", "-", "@")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_VERSION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
RUN_ID_PREFIX = "sheet"


class InvalidUrl(ValueError):
    """The cell is not an article URL; ``str(error)`` is the reason written into the row."""


def normalise_url(value: str) -> str:
    """Return the canonical form of an http(s) URL or raise :class:`InvalidUrl` with a reason.

    Surrounding whitespace is ignored; scheme and host are lower-cased; default ports and the
    fragment are dropped; an empty path becomes ``/``. Formula-like text (``=HYPERLINK(...)``) is
    rejected as text, never evaluated.

    :param value: the cell as read.
    """
    text = (value or "").strip()
    if not text:
        raise InvalidUrl("empty URL")
    if text.startswith(FORMULA_PREFIXES):
        raise InvalidUrl(f"formula-like value is not a URL (not evaluated): {text[:80]!r}")
    if any(ch.isspace() for ch in text):
        raise InvalidUrl(f"URL contains whitespace: {text[:80]!r}")
    if len(text) > 2048:
        raise InvalidUrl("URL longer than 2048 characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise InvalidUrl(f"malformed URL ({err}): {text[:80]!r}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidUrl(f"URL must start with http:// or https://: {text[:80]!r}")
    host = (parts.hostname or "").lower()
    if not host or not (
        ("." in host and not host.startswith(".") and not host.endswith(".")) or host == "localhost"
    ):
        raise InvalidUrl(f"URL has no valid host: {text[:80]!r}")
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    if parts.username or parts.password:
        raise InvalidUrl("URL must not contain credentials")
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def row_key(normalised_url: str) -> str:
    """The stable key of an article: a short hash of its normalised URL."""
    return hashlib.sha256(normalised_url.encode()).hexdigest()[:20]


def check_version(version: str) -> str:
    # fullmatch: "$" alone lets a trailing newline through. No leading dot: the version is a path
    # segment of the article's step outputs and published page, where "." and ".." mean folders.
    """Return ``version`` when it is a valid processing version, else raise ``ValueError`` naming the rule."""
    if not _VERSION_RE.fullmatch(version) or version.startswith("."):
        raise ValueError(
            f"processing version must match {_VERSION_RE.pattern} and not start with '.', got {version!r}"
        )
    return version


def pipeline_run_id(key: str, version: str) -> str:
    """Deterministic ``article_pipeline`` run id for a row key and processing version.

    Valid under Airflow's default ``allowed_run_id_pattern`` (``^[A-Za-z0-9_.~:+-]+$``).
    """
    return f"{RUN_ID_PREFIX}__{key}__{check_version(version)}"


def parse_run_id(run_id: str) -> tuple[str, str] | None:
    """``(row key, version)`` of a :func:`pipeline_run_id`, or ``None`` for any other text."""
    parts = run_id.strip().split("__")
    if len(parts) != 3 or parts[0] != RUN_ID_PREFIX or not parts[1] or not _VERSION_RE.match(parts[2]):
        return None
    return parts[1], parts[2]


#: The keys of an ``article_pipeline`` run conf (and of its ledger item's payload).
RUN_CONF_KEYS = ("claim_token", "row_key", "url", "spreadsheet_id", "sheet", "processing_version")
#: The conf key (and ledger payload key) naming the ``article_batch`` run a claim went to.
BATCH_RUN_KEY = "batch_run_id"
BATCH_RUN_PREFIX = "batch"


def batch_run_id(first_token: str) -> str:
    """The ``article_batch`` run id of a batch: from its first claim token (unique: a claim time
    and random hex), valid under Airflow's default ``allowed_run_id_pattern``."""
    if not first_token or not re.fullmatch(r"[A-Za-z0-9_.~:+-]+", first_token):
        raise ValueError(f"not a claim token a run id can carry: {first_token!r}")
    return f"{BATCH_RUN_PREFIX}__{first_token}"


def article_run_conf(
    *, token: str, key: str, url: str, spreadsheet_id: str, sheet: str, version: str
) -> dict[str, str]:
    """The ``article_pipeline`` run conf of a claimed row: enough to find the row again by its
    claim token, wherever it moved. ``sheet_claim``, ``sheet_reconcile`` and the ledger item all
    carry exactly this."""
    values = (token, key, url, spreadsheet_id, sheet, version)
    return dict(zip(RUN_CONF_KEYS, values, strict=True))
