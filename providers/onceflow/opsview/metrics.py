"""The six answers as metrics: OpenMetrics text for Prometheus, and gauges through Airflow's own
metrics settings (``[metrics] statsd_on`` / ``otel_on``), so they land wherever Airflow's do.

One list of samples (:func:`samples`) feeds both, so the names cannot drift apart. Names and labels
are documented in ``docs/operations-view.md``; ``deploy/grafana/onceflow-operations.json`` is a
dashboard on them. Through StatsD the labels become tags (a StatsD without tags, such as the
classic one, keeps the name and loses the split).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PREFIX = "onceflow_ops_"
#: Seconds between two emissions of the gauges through Airflow's Stats (``[onceflow_ops] stats_interval``).
STATS_INTERVAL_S = 60.0


@dataclass(frozen=True)
class Sample:
    """One metric sample: name, help text, labels and value."""

    name: str
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float


HELP = {
    "discovered_last_hour": "Work items created in the last hour (question 1).",
    "seconds_since_last_discovery": "Seconds since the newest work item of the kind was created (question 1).",
    "completed_last_hour": "Work items that reached done in the last hour.",
    "eligible_items": "Items a claim may take now: pending and available, or leased with the lease run out (question 2).",
    "oldest_eligible_age_seconds": "Age of the oldest eligible item since its creation (question 2).",
    "lease_expiries_24h": "Lease expiries in the last 24 hours (question 3).",
    "lease_expiries_trailing_week_daily_mean": "Daily mean of lease expiries in the 7 days before the last 24 hours (question 3).",
    "error_attempts": "Attempts spent by items whose last error is of the class, last 7 days (question 4).",
    "error_items_retrying": "Live items whose last error is of the class (question 4).",
    "outbox_pending_rows": "Outbox rows not relayed yet (question 5).",
    "outbox_oldest_pending_age_seconds": "Age of the oldest outbox row not relayed (question 5).",
    "published_not_written_back": "Published articles without their sheet write-back after the settle time (question 5).",
    "version_live_items": "Pending or leased items requiring the processing version (question 6).",
    "version_results_7d": "Results committed under the processing version in the last 7 days (question 6).",
}


def _s(name: str, value: float | None, **labels: Any) -> Iterator[Sample]:
    if value is None:
        return
    yield Sample(
        PREFIX + name,
        HELP[name],
        tuple((k, "" if v is None else str(v)) for k, v in labels.items()),
        float(value),
    )


def samples(doc: dict[str, Any]) -> list[Sample]:
    """The metrics of one ``questions`` document (:func:`onceflow.opsview.questions.all_questions`)."""
    out: list[Sample] = []
    d = doc["discovery"]
    for k in d["kinds"]:
        out += _s("discovered_last_hour", k["created_last_hour"], kind=k["kind"])
        out += _s("seconds_since_last_discovery", k["seconds_since_last"], kind=k["kind"])
    out += _s("completed_last_hour", d["completed_per_hour"][-1] if d["completed_per_hour"] else 0)
    for g in doc["oldest_eligible"]["groups"]:
        labels = {"kind": g["kind"], "lane": g["lane"], "priority": g["priority"], "version": g["version"]}
        out += _s("eligible_items", g["items"], **labels)
        out += _s("oldest_eligible_age_seconds", g["oldest_age_s"], **labels)
    e = doc["lease_expiries"]
    out += _s("lease_expiries_24h", e["last_24h"])
    out += _s("lease_expiries_trailing_week_daily_mean", e["trailing_week_daily_mean"])
    for c in doc["error_classes"]["classes"]:
        out += _s("error_attempts", c["attempts"], kind=c["kind"], error_class=c["error_class"])
        out += _s("error_items_retrying", c["retrying"], kind=c["kind"], error_class=c["error_class"])
    f = doc["follow_ups"]
    for row in f["outbox_pending"]:
        out += _s("outbox_pending_rows", row["rows"], target_type=row["target_type"])
        out += _s("outbox_oldest_pending_age_seconds", row["oldest_age_s"], target_type=row["target_type"])
    out += _s("published_not_written_back", f["published_not_written_back"])
    for v in doc["active_versions"]["versions"]:
        out += _s("version_live_items", v["live_items"], version=v["version"])
        out += _s("version_results_7d", v["results"], version=v["version"])
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() else repr(value)


def openmetrics(doc: dict[str, Any]) -> str:
    """OpenMetrics 1.0 text: one gauge family per name (declared even when it has no sample)."""
    by_name: dict[str, list[Sample]] = {PREFIX + name: [] for name in HELP}
    for sample in samples(doc):
        by_name[sample.name].append(sample)
    lines = []
    for name, family in by_name.items():
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"# HELP {name} {HELP[name.removeprefix(PREFIX)]}")
        for s in family:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
            lines.append(f"{name}{{{labels}}} {_number(s.value)}" if labels else f"{name} {_number(s.value)}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def emit(doc: dict[str, Any]) -> int:
    """Send the samples as gauges through Airflow's Stats (StatsD or OpenTelemetry, as configured)."""
    # ``Stats`` (not 3.3's module-level ``gauge``): the one spelling Airflow 3.2 and 3.3 share
    from airflow.observability.stats import Stats

    found = samples(doc)
    for s in found:
        Stats.gauge(s.name, s.value, tags=dict(s.labels))
    return len(found)


class StatsEmitter:
    """Emit the gauges every ``interval`` seconds from a daemon thread of the api-server.

    :param build: returns a fresh ``questions`` document.
    """

    def __init__(self, build: Callable[[], dict[str, Any]], interval: float = STATS_INTERVAL_S) -> None:
        self.build = build
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="onceflow-ops-stats", daemon=True)

    def start(self) -> StatsEmitter:
        """Start sending the figures to Airflow's metrics backend in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background thread."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                emit(self.build())
            except Exception:  # a ledger hiccup must not end the thread
                log.warning("onceflow operations view: emitting metrics failed", exc_info=True)
            self._stop.wait(max(1.0, self.interval - (time.monotonic() - started)))


def metrics_backend_on() -> bool:
    """Whether Airflow sends metrics (StatsD or OpenTelemetry)."""
    from airflow.configuration import conf

    return conf.getboolean("metrics", "statsd_on", fallback=False) or conf.getboolean(
        "metrics", "otel_on", fallback=False
    )
