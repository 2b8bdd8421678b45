"""The BigQuery partition overwrite, with the real google-cloud-bigquery client and BigQueryHook.

BigQuery itself cannot run here. A stub HTTP endpoint on 127.0.0.1 stands in for it: it records
the job insert request (the multipart upload of a load job) and answers with a DONE job. The
assertions are on what the real client sent: the destination with the partition decorator,
``WRITE_TRUNCATE``, the source format, the partitioning and the uploaded rows. Whether BigQuery
then swaps the partition atomically is BigQuery's documented behaviour, not tested here.
"""

from __future__ import annotations

import datetime as dt
import email.parser
import json
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sales.generator import GeneratorConfig
from onceflow.sales.partitions import InvalidNameError
from onceflow.testing.sales_fixtures import clean_day

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DAY = dt.date(2024, 10, 27)
PROJECT = "onceflow-test"
RESULT = clean_day(DAY, GeneratorConfig(seed=4, orders_per_day=40))


class BigQueryStub(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.jobs: dict[str, dict[str, Any]] = {}
        self.uploads: list[tuple[dict[str, Any], bytes]] = []
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: BigQueryStub

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, body: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.server.requests.append(f"POST {self.path}")
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if not self.path.startswith(f"/upload/bigquery/v2/projects/{PROJECT}/jobs"):
            self._reply({"error": {"message": f"unexpected {self.path}"}}, 404)
            return
        message = email.parser.BytesParser().parsebytes(
            b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body
        )
        meta_part, data_part = message.get_payload()  # type: ignore[misc]
        resource = json.loads(meta_part.get_payload(decode=True))
        data = data_part.get_payload(decode=True)
        self.server.uploads.append((resource, data))
        job_id = resource["jobReference"]["jobId"]
        done = {
            **resource,
            "id": f"{PROJECT}:US.{job_id}",
            "jobReference": {**resource["jobReference"], "location": "US"},
            "status": {"state": "DONE"},
            "statistics": {"creationTime": "1700000000000", "load": {"outputRows": str(data.count(b"\n"))}},
        }
        self.server.jobs[job_id] = done
        self._reply(done)

    def do_GET(self) -> None:
        self.server.requests.append(f"GET {self.path}")
        job_id = self.path.split("?")[0].rsplit("/", 1)[-1]
        if job_id in self.server.jobs:
            self._reply(self.server.jobs[job_id])
        else:
            self._reply({"error": {"message": "not found"}}, 404)


@pytest.fixture
def bigquery_stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[BigQueryStub]:
    stub = BigQueryStub()
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("BIGQUERY_EMULATOR_HOST", stub.url)
    conn = {"conn_type": "google_cloud_platform", "extra": {"project": PROJECT, "is_anonymous": True}}
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WAREHOUSE_BQ", json.dumps(conn))
    yield stub
    stub.shutdown()
    stub.server_close()


def test_the_load_job_truncates_exactly_the_decorated_partition(bigquery_stub: BigQueryStub) -> None:
    from onceflow.hooks.warehouse import WarehouseHook

    hook = WarehouseHook("onceflow_warehouse_bq")
    assert hook.is_bigquery
    job = hook.overwrite_bigquery_partition(
        table="daily_sales", partition=DAY, rows=RESULT.rows, dataset="sales"
    )

    assert len(bigquery_stub.uploads) == 1
    resource, data = bigquery_stub.uploads[0]
    load = resource["configuration"]["load"]
    assert load["destinationTable"] == {
        "projectId": PROJECT,
        "datasetId": "sales",
        "tableId": "daily_sales$20241027",
    }
    assert load["writeDisposition"] == "WRITE_TRUNCATE"
    assert load["sourceFormat"] == "NEWLINE_DELIMITED_JSON"
    assert load["timePartitioning"] == {"type": "DAY", "field": "partition_date"}
    assert [f["name"] for f in load["schema"]["fields"]][:2] == ["partition_date", "order_id"]
    lines = [json.loads(line) for line in data.decode().splitlines()]
    assert len(lines) == len(RESULT.rows)
    assert {line["partition_date"] for line in lines} == {"2024-10-27"}
    assert sorted(line["order_id"] for line in lines) == sorted(RESULT.rows["order_id"])
    assert job["state"] == "DONE"
    assert job["destination"] == f"{PROJECT}.sales.daily_sales$20241027"
    assert job["output_rows"] == len(RESULT.rows)


def test_the_operator_loads_bigquery_and_audits_in_sql(
    bigquery_stub: BigQueryStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow.operators.partition import PartitionOverwriteOperator
    from onceflow.sales import staging
    from onceflow.sales.clean import PROCESSING_VERSION
    from onceflow.sales.engine import make_engine
    from onceflow.sales.partition_store import PartitionStore

    audit_url = f"sqlite:///{tmp_path / 'audit.db'}"
    folder = tmp_path / "stage"
    staging.write_clean(folder, RESULT, partition=DAY, processing_version=PROCESSING_VERSION)
    op = PartitionOverwriteOperator(
        task_id="load",
        partition=DAY.isoformat(),
        staging_dir=str(folder),
        warehouse_conn_id="onceflow_warehouse_bq",
        audit_conn_id="audit_db",
        bigquery_dataset="sales",
    )
    import os

    os.environ["AIRFLOW_CONN_AUDIT_DB"] = json.dumps(
        {"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}
    )
    try:
        context: Any = {"run_id": "scheduled__x", "ti": types.SimpleNamespace(try_number=1)}
        out = op.execute(context)
    finally:
        del os.environ["AIRFLOW_CONN_AUDIT_DB"]
    assert bigquery_stub.uploads[0][0]["configuration"]["load"]["writeDisposition"] == "WRITE_TRUNCATE"
    audit = PartitionStore(make_engine(audit_url), "daily_sales").audit(DAY)
    assert audit is not None
    assert (audit.row_count, audit.checksum, audit.run_id) == (
        len(RESULT.rows),
        out["checksum"],
        "scheduled__x",
    )


def test_an_injection_shaped_dataset_is_refused_before_any_request(bigquery_stub: BigQueryStub) -> None:
    from onceflow.hooks.warehouse import WarehouseHook

    hook = WarehouseHook("onceflow_warehouse_bq")
    with pytest.raises(InvalidNameError):
        hook.overwrite_bigquery_partition(
            table="daily_sales", partition=DAY, rows=RESULT.rows, dataset="sales`; DROP SCHEMA x; --"
        )
    with pytest.raises(InvalidNameError):
        hook.overwrite_bigquery_partition(
            table="daily$sales", partition=DAY, rows=RESULT.rows, dataset="sales"
        )
    assert bigquery_stub.uploads == []
