"""The operations view's figures reach Airflow's own metrics backend (issue 23, "the same figures as
metrics: through Airflow's own metrics settings").

A child process with ``[metrics] otel_on`` pointed at a loopback OTLP/HTTP receiver answers the six
questions over a seeded ledger and sends them with ``metrics.emit`` through Airflow's ``Stats``;
the receiver decodes what arrived on the wire (OTLP protobuf) and the test compares it with the
samples computed here from the same ledger. A child, because Airflow builds its ``Stats`` backend
once per process from the configuration (the child initialises it as the api-server does at start,
where the view's emitter thread runs). (StatsD is the other backend Airflow offers; its client
package is not installed here, and OTLP is the one Airflow ships.)
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from onceflow.opsview import metrics, questions
from onceflow.testing.ops_view_state import seed_ledger

if TYPE_CHECKING:
    from pathlib import Path

NOW = 1_790_000_000.0


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.bodies.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args: Any) -> None:
        pass


def _gauges(bodies: list[tuple[str, bytes]]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The last value of each (name, attributes) gauge point in the OTLP requests received."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for path, body in bodies:
        assert path == "/v1/metrics", path
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.gauge.data_points:
                        attrs = tuple(sorted((a.key, a.value.string_value) for a in p.attributes))
                        value = p.as_double if p.HasField("as_double") else float(p.as_int)
                        out[(m.name, attrs)] = value
    return out


def test_the_six_answers_arrive_as_gauges_through_airflows_otel_metrics(tmp_path: Path) -> None:
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = sa.create_engine(ledger_url)
    seed_ledger(engine, NOW)
    with engine.connect() as conn:
        expected = metrics.samples(questions.all_questions(conn, NOW))
    engine.dispose()
    assert len(expected) > 10, "a seeded ledger gives many samples"

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    server.bodies = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    child = textwrap.dedent(
        """
        import sys, time
        import sqlalchemy as sa
        from airflow._shared.observability.metrics import stats
        from airflow.configuration import conf
        from airflow.observability.metrics import stats_utils
        from onceflow.opsview import metrics, questions
        # What the api-server does at start (airflow.api_fastapi.app), where the emitter runs.
        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on"),
        )
        with sa.create_engine(sys.argv[1]).connect() as conn:
            doc = questions.all_questions(conn, float(sys.argv[2]))
        print("EMITTED", metrics.emit(doc), flush=True)
        time.sleep(2.5)  # two export intervals; the exporter also flushes at exit
        """
    )
    env = {
        **os.environ,
        "AIRFLOW__METRICS__OTEL_ON": "True",
        "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__OTEL_PORT": str(server.server_address[1]),
        "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "500",
        "AIRFLOW__METRICS__STATSD_ON": "False",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", child, ledger_url, str(NOW)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"EMITTED {len(expected)}" in done.stdout, done.stdout

    got = _gauges(server.bodies)  # type: ignore[attr-defined]
    assert got, f"no OTLP metrics reached the receiver; child stderr:\n{done.stderr[-3000:]}"
    missing, wrong = [], []
    for s in expected:
        # Airflow prefixes its metric names ([metrics] otel_prefix, "airflow.").
        key = (f"airflow.{s.name}", tuple(sorted((k, str(v)) for k, v in s.labels)))
        if key not in got:
            missing.append(key)
        elif abs(got[key] - s.value) > 1e-6 * max(1.0, abs(s.value)):
            wrong.append((key, got[key], s.value))
    assert not missing, (
        f"{len(missing)} of {len(expected)} gauges never arrived, e.g. {missing[:3]}; got {sorted(got)[:5]}"
    )
    assert not wrong, wrong[:5]
    print(json.dumps({"gauges": len(got)}))
