"""A BigQuery stand-in on 127.0.0.1 for the daily_sales load, driven by the real google client.

BigQuery cannot run here, and no emulator runs its scripting. :class:`BigQueryStub` speaks the
parts of the REST API that :func:`onceflow.sales.bigquery.fenced_overwrite` uses, and models what
BigQuery does with them:

* **load jobs** (multipart upload): ``WRITE_TRUNCATE`` replaces the destination table, or one day
  of it when the table id carries a ``$YYYYMMDD`` decorator; ``WRITE_APPEND`` appends;
* **query jobs** running the ``-- onceflow:partition_swap`` script: the transaction is modelled as
  a whole (under one lock, as BigQuery serialises two transactions on one table by aborting one):
  the fence table's checks and their ``RAISE``, the delete and insert of the partition, the fence
  update, the staging table's drop. Each check and each fence or drop step is applied only if
  the script carries its statement, so a script that lost one is not rescued by the stub. Any
  other query fails, as an unsupported statement;
* ``jobs.get``, ``jobs.getQueryResults``, ``tables.list`` (one page) and ``tables.delete``;
* **failing jobs**: :meth:`BigQueryStub.fail_next` makes the next job of a kind finish ``DONE``
  with an ``errorResult`` and change nothing; :meth:`BigQueryStub.hold_next_write` holds the next
  job that would change a table until released (a stalled writer).

Point the client at it with ``BIGQUERY_EMULATOR_HOST=<stub.url>`` and an anonymous
``google_cloud_platform`` connection (see ``tests/integration/test_partition_bigquery.py``).
"""

from __future__ import annotations

import datetime as dt
import email.parser
import json
import re
import threading
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from onceflow.sales.bigquery import OLDER_MARKER, STALE_MARKER
from onceflow.sales.schema import SALES_COLUMNS

_SWAP_HEADER = re.compile(r"^-- onceflow:partition_swap target=(\S+) staging=(\S+) fence=(\S+)")


class BigQueryStub(ThreadingHTTPServer):
    """The stub server; ``with BigQueryStub() as stub:`` serves it on a free port in a thread.

    :param project: the only project it answers for.
    """

    daemon_threads = True

    def __init__(self, project: str = "onceflow-test") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.project = project
        self.lock = threading.Lock()
        #: table id ``project.dataset.table`` -> rows (JSON objects as loaded).
        self.tables: dict[str, list[dict[str, Any]]] = {}
        #: ``(table_name, partition_key)`` -> the fence table's row.
        self.fence: dict[tuple[str, str], dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        #: every job resource as received, in order (``configuration`` as the client sent it).
        self.received: list[dict[str, Any]] = []
        self._failures: dict[str, list[str]] = {"load": [], "query": []}
        self._holds: list[threading.Event] = []
        self._held = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> BigQueryStub:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for event in self._holds:
            event.set()
        self.shutdown()
        self.server_close()

    # -- test controls ------------------------------------------------------------------------

    def fail_next(self, kind: str, message: str = "invalid: the stub failed this job") -> None:
        """The next job of ``kind`` (``load`` or ``query``) fails with ``message``, changing nothing.

        The text before the first colon is the error's ``reason``. The client re-runs a query job
        that failed with a transient reason (``backendError``, ``rateLimitExceeded``, ...) by itself.
        """
        self._failures[kind].append(message)

    def hold_next_write(self) -> threading.Event:
        """Hold the next job that would change a non-staging table until the returned event is set."""
        release = threading.Event()
        self._holds.append(release)
        return release

    def wait_until_held(self, timeout: float = 120.0) -> bool:
        """Wait until a held job has arrived (it is then blocked on its release event)."""
        return self._held.wait(timeout)

    def partition_rows(self, table_id: str, day: dt.date) -> list[tuple[Any, ...]]:
        """The stored rows of one day as typed tuples in ``SALES_COLUMNS`` order."""
        out = []
        for row in self.tables.get(table_id, []):
            if row["partition_date"] != day.isoformat():
                continue
            values: list[Any] = [row.get(name) for name in SALES_COLUMNS]
            values[0] = dt.date.fromisoformat(str(row["partition_date"]))
            values[-1] = dt.datetime.fromisoformat(str(row["first_event_utc"]).removesuffix(" UTC"))
            out.append(tuple(values))
        return out

    # -- the model ----------------------------------------------------------------------------

    def _maybe_hold(self, writes_target: bool) -> None:
        if writes_target and self._holds:
            release = self._holds.pop(0)
            self._held.set()
            release.wait()

    def run_load(self, resource: dict[str, Any], data: bytes) -> str | None:
        """Apply a load job; returns an error message instead when it fails."""
        load = resource["configuration"]["load"]
        dest = load["destinationTable"]
        table_id, _, decorator = f"{dest['projectId']}.{dest['datasetId']}.{dest['tableId']}".partition("$")
        self._maybe_hold(writes_target="__onceflow_stage_" not in table_id)
        rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        with self.lock:
            if self._failures["load"]:
                return self._failures["load"].pop(0)
            existing = self.tables.get(table_id, [])
            if load.get("writeDisposition") == "WRITE_TRUNCATE":
                if decorator:
                    day = dt.datetime.strptime(decorator, "%Y%m%d").date().isoformat()
                    existing = [r for r in existing if r["partition_date"] != day]
                else:
                    existing = []
            self.tables[table_id] = existing + rows
        return None

    def run_query(self, resource: dict[str, Any]) -> str | None:
        """Apply the partition swap script; returns an error message instead when it fails."""
        query = resource["configuration"]["query"]
        match = _SWAP_HEADER.match(query.get("query", ""))
        if match is None:
            return "invalidQuery: the stub only runs the onceflow partition swap"
        target, staging, fence = match.groups()
        script = query["query"]
        # Model only what the script says: a check or step the script lost is not made here either.
        checks_token = re.search(r"IF newest_token > @fence_token THEN\s+RAISE", script) is not None
        checks_watermark = re.search(r"IF newest_watermark > @source_watermark_utc\b", script) is not None
        records_fence = f"MERGE `{fence}`" in script
        drops_staging = f"DROP TABLE IF EXISTS `{staging}`" in script
        params = {
            p["name"]: p.get("parameterValue", {}).get("value") for p in query.get("queryParameters", [])
        }
        self._maybe_hold(writes_target=True)
        with self.lock:
            if self._failures["query"]:
                return self._failures["query"].pop(0)
            key = (params["table_name"], params["partition_key"])
            token = int(params["fence_token"])
            watermark = _timestamp(params.get("source_watermark_utc"))
            row = self.fence.get(key)
            if checks_token and row is not None and row["committed_token"] > token:
                return f"{STALE_MARKER}: fence token {row['committed_token']} committed, this attempt holds {token}"
            newest = None if row is None else row["source_watermark_utc"]
            if checks_watermark and newest is not None and (watermark is None or newest > watermark):
                return f"{OLDER_MARKER}: the partition holds an extract read at {newest.isoformat()}"
            if staging not in self.tables:
                return f"notFound: Not found: Table {staging}"
            day = params["day"]
            kept = [r for r in self.tables.get(target, []) if r["partition_date"] != day]
            self.tables[target] = kept + [dict(r) for r in self.tables[staging]]
            if records_fence:
                self.fence[key] = {
                    "committed_token": token,
                    "source_watermark_utc": watermark,
                    "run_id": params["run_id"],
                    "try_number": int(params["try_number"]),
                }
            if drops_staging:
                del self.tables[staging]
        return None


def _timestamp(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace(" UTC", "+00:00")).astimezone(dt.timezone.utc)


class _Handler(BaseHTTPRequestHandler):
    server: BigQueryStub

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, body: dict[str, Any] | None, status: int = 200) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _finish(self, resource: dict[str, Any], error: str | None, statistics: dict[str, Any]) -> None:
        job_id = resource["jobReference"]["jobId"]
        status: dict[str, Any] = {"state": "DONE"}
        if error is not None:
            reason = error.split(":", 1)[0] if ":" in error else "invalidQuery"
            status["errorResult"] = {"reason": reason, "message": error}
            status["errors"] = [status["errorResult"]]
        done = {
            **resource,
            "id": f"{self.server.project}:US.{job_id}",
            "jobReference": {**resource["jobReference"], "location": "US"},
            "status": status,
            "statistics": {"creationTime": "1700000000000", **statistics},
        }
        self.server.jobs[job_id] = done
        self._reply(done)

    def do_POST(self) -> None:
        project = self.server.project
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.startswith(f"/upload/bigquery/v2/projects/{project}/jobs"):
            message = email.parser.BytesParser().parsebytes(
                b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body
            )
            meta_part, data_part = cast("list[Message]", message.get_payload())
            resource = json.loads(cast("bytes", meta_part.get_payload(decode=True)))
            data = cast("bytes", data_part.get_payload(decode=True))
            self.server.received.append(resource)
            error = self.server.run_load(resource, data)
            rows = str(0 if error else data.count(b"\n"))
            self._finish(resource, error, {"load": {"outputRows": rows}})
        elif self.path.split("?")[0] == f"/bigquery/v2/projects/{project}/jobs":
            resource = json.loads(body)
            self.server.received.append(resource)
            error = self.server.run_query(resource)
            self._finish(resource, error, {"query": {"statementType": "SCRIPT"}})
        else:
            self._reply({"error": {"code": 404, "message": f"unexpected POST {self.path}"}}, 404)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        listing = re.fullmatch(r"/bigquery/v2/projects/([^/]+)/datasets/([^/]+)/tables", path)
        if listing is not None:
            self._list_tables(*listing.groups())
            return
        job_id = path.rsplit("/", 1)[-1]
        job = self.server.jobs.get(job_id)
        if job is None:
            self._reply({"error": {"code": 404, "message": f"Not found: Job {job_id}"}}, 404)
        elif "/queries/" in path:
            error = job["status"].get("errorResult")
            if error is not None:
                self._reply({"error": {"code": 400, "message": error["message"], "errors": [error]}}, 400)
            else:
                self._reply(
                    {
                        "kind": "bigquery#getQueryResultsResponse",
                        "jobReference": job["jobReference"],
                        "jobComplete": True,
                        "totalRows": "0",
                        "schema": {"fields": []},
                    }
                )
        else:
            self._reply(job)

    def _list_tables(self, project: str, dataset: str) -> None:
        """``tables.list``: every table of the dataset, in one page."""
        prefix = f"{project}.{dataset}."
        with self.server.lock:
            names = sorted(t.removeprefix(prefix) for t in self.server.tables if t.startswith(prefix))
        tables = [
            {
                "kind": "bigquery#table",
                "id": f"{project}:{dataset}.{name}",
                "tableReference": {"projectId": project, "datasetId": dataset, "tableId": name},
                "type": "TABLE",
            }
            for name in names
        ]
        self._reply({"kind": "bigquery#tableList", "tables": tables, "totalItems": len(tables)})

    def do_DELETE(self) -> None:
        match = re.fullmatch(
            r"/bigquery/v2/projects/([^/]+)/datasets/([^/]+)/tables/([^/?]+)", self.path.split("?")[0]
        )
        if match is None:
            self._reply({"error": {"code": 404, "message": f"unexpected DELETE {self.path}"}}, 404)
            return
        with self.server.lock:
            found = self.server.tables.pop(".".join(match.groups()), None)
        if found is None:
            self._reply({"error": {"code": 404, "message": "Not found: Table"}}, 404)
        else:
            self._reply(None, 204)
