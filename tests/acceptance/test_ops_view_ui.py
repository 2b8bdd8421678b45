"""The operations view in a real api-server, driven by headless Chromium, and its access checks.

One api-server (no scheduler: the view reads stored state) serves every test of this module, with
SimpleAuthManager users of each role, a seeded ledger and warehouse (``onceflow.testing.
ops_view_state``), a Sheets emulator holding the queue, and a rendered sales dashboard. The
browser runs Debian's /usr/bin/chromium through Playwright. Screenshots go to
``.onceflow/screenshots/`` (ignored by git).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from onceflow.testing.ops_view_state import (
    SCRIPT_REASON,
    SCRIPT_TITLE,
    SCRIPT_URL,
    Expected,
    seed_ledger,
    seed_partitions,
)

pytestmark = pytest.mark.real_airflow

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".onceflow" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORDS = {"admin": "admin-pw", "viewer": "viewer-pw", "norole": "norole-pw"}
METRICS_TOKEN = "scrape-secret-1"
REVIEW_RUN = "sheet__rk-review__v1"
MISSING_DAY_OFFSET = 5  # days before yesterday
PREFIX = "/onceflow-ops"
ENDPOINTS = [
    f"{PREFIX}/",
    *(
        f"{PREFIX}/api/v1/{s}"
        for s in ("questions", "partitions", "queue", "articles", "watchdog", "dashboard")
    ),
    f"{PREFIX}/dashboard/index.html",
]


@dataclass
class Server:
    url: str
    expected: Expected
    missing_day: str
    tokens: dict[str, str]
    otel: OtlpReceiver


class OtlpReceiver:
    """A loopback OTLP/HTTP metrics receiver: what Airflow's OpenTelemetry metrics export sends,
    decoded with the OTLP protobuf classes (gauge name -> {attributes: last value})."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        self.gauges: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportMetricsServiceRequest.FromString(body)
                with receiver.lock:
                    for rm in request.resource_metrics:
                        for sm in rm.scope_metrics:
                            for metric in sm.metrics:
                                if metric.HasField("gauge"):
                                    for point in metric.gauge.data_points:
                                        attrs = tuple(
                                            sorted((a.key, a.value.string_value) for a in point.attributes)
                                        )
                                        value = (
                                            point.as_double if point.HasField("as_double") else point.as_int
                                        )
                                        receiver.gauges.setdefault(metric.name, {})[attrs] = value
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def find(self, suffix: str) -> dict[tuple[tuple[str, str], ...], float] | None:
        with self.lock:
            return next((dict(v) for k, v in self.gauges.items() if k.endswith(suffix)), None)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _request(
    url: str,
    *,
    token: str | None = None,
    cookie: str | None = None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie:
        req.add_header("Cookie", f"_token={cookie}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def _login(base: str, user: str) -> str:
    body = json.dumps({"username": user, "password": PASSWORDS[user]}).encode()
    status, raw, _ = _request(f"{base}/auth/token", data=body, headers={"Content-Type": "application/json"})
    assert status == 201, raw
    return str(json.loads(raw)["access_token"])


@pytest.fixture(scope="module")
def server(onceflow_airflow_db: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from onceflow.testing.airflow_cluster import AirflowCluster
    from onceflow.testing.sheets_fixtures import CLAIMED_QUEUE_HEADER, SheetsEmulator

    work = tmp_path_factory.mktemp("ops-view")
    now = time.time()
    ledger = sa.create_engine(f"sqlite:///{work / 'ledger.db'}")
    expected = seed_ledger(ledger, now)
    ledger.dispose()
    today = (
        dt.datetime.fromtimestamp(now, dt.timezone.utc)
        .astimezone(__import__("zoneinfo").ZoneInfo("Europe/Amsterdam"))
        .date()
    )
    yesterday = today - dt.timedelta(days=1)
    missing = yesterday - dt.timedelta(days=MISSING_DAY_OFFSET)
    warehouse = sa.create_engine(f"sqlite:///{work / 'warehouse.db'}")
    seed_partitions(
        warehouse,
        "daily_sales",
        [yesterday - dt.timedelta(days=i) for i in range(20) if i != MISSING_DAY_OFFSET],
    )
    warehouse.dispose()
    dashboard = work / "dashboard"
    dashboard.mkdir()
    (dashboard / "index.html").write_text("<html><body><h1>Sales, last 30 days</h1></body></html>")
    passwords = work / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))

    emulator = SheetsEmulator(work / "sheets.json")
    width = len(CLAIMED_QUEUE_HEADER)

    def row(**cells: str) -> list[str]:
        return [cells.get(h, "") for h in CLAIMED_QUEUE_HEADER][:width]

    sid = emulator.create_spreadsheet(
        "articles",
        sheets={
            "queue": [
                CLAIMED_QUEUE_HEADER,
                row(
                    url="https://news.example/low-score.html",
                    status="NEEDS_REVIEW #20261202T080000Z-abc123-v1",
                    run_id=REVIEW_RUN,
                    score="0.61",
                    reason="score 0.61 below 0.95",
                ),
                row(url=SCRIPT_URL, status="INVALID", reason=SCRIPT_REASON),
                row(url="https://news.example/" + SCRIPT_TITLE, status="FAILED", reason="not HTML"),
                row(url="https://news.example/new.html", status="NEW"),
                row(
                    url="https://news.example/done.html",
                    status="DONE #20261202T070000Z-def456-v1",
                    run_id="sheet__rk-done__v1",
                ),
            ]
        },
    )
    otel = OtlpReceiver()
    cluster = AirflowCluster(
        onceflow_airflow_db.variables,
        work / "cluster",
        components=("api-server",),
        env={
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer,norole:",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__ONCEFLOW_OPS__METRICS_TOKEN": METRICS_TOKEN,
            "AIRFLOW__ONCEFLOW_OPS__CALENDAR_DAYS": "20",  # the 20 seeded days, one of them missing
            # Airflow's own metrics settings: OpenTelemetry to the loopback receiver, every second
            "AIRFLOW__METRICS__OTEL_ON": "True",
            "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__OTEL_PORT": str(otel.port),
            "AIRFLOW__METRICS__OTEL_SSL_ACTIVE": "False",
            "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "1000",
            "AIRFLOW__ONCEFLOW_OPS__STATS_INTERVAL": "2",
            "AIRFLOW_CONN_ONCEFLOW_LEDGER": json.dumps(
                {"conn_type": "generic", "extra": {"sqlalchemy_url": f"sqlite:///{work / 'ledger.db'}"}}
            ),
            "AIRFLOW_CONN_ONCEFLOW_WAREHOUSE": json.dumps(
                {"conn_type": "generic", "extra": {"sqlalchemy_url": f"sqlite:///{work / 'warehouse.db'}"}}
            ),
            "AIRFLOW_CONN_ONCEFLOW_SHEETS": emulator.connection_json(spreadsheet_id=sid),
            "ONCEFLOW_DASHBOARD_DIR": str(dashboard),
            "ONCEFLOW_BUSINESS_TZ": "Europe/Amsterdam",
            "ONCEFLOW_SALES_START_DATE": "2020-01-01",
        },
    )
    try:
        cluster.start(timeout=180)
        tokens = {user: _login(cluster.api_url, user) for user in PASSWORDS}
        yield Server(cluster.api_url, expected, missing.isoformat(), tokens, otel)
    finally:
        cluster.stop()
        emulator.stop()
        otel.stop()
        assert not cluster.leftover_pids()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def ops_page(server: Server, browser: Any) -> Iterator[Any]:
    """The page as the admin sees it (the UI's ``_token`` cookie), loaded once."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": "_token", "value": server.tokens["admin"], "url": server.url}])
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    response = page.goto(f"{server.url}{PREFIX}/")
    assert response is not None and response.status == 200, response and response.text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ops-view.png"), full_page=True)
    page.dialogs = dialogs  # type: ignore[attr-defined]
    yield page
    context.close()


def _value(page: Any, selector: str) -> float:
    return float(page.locator(selector).first.get_attribute("data-value"))


def test_each_of_the_six_questions_shows_the_seeded_answer(ops_page: Any, server: Server) -> None:
    page, exp = ops_page, server.expected
    shown_now = float(page.locator("body").get_attribute("data-now"))
    elapsed = shown_now - exp.now
    assert 0 <= elapsed < 600
    # 1. discovery: the newest item 60 s before seeding; per kind, created in the window
    assert _value(page, "#q1-since-last") == pytest.approx(
        exp.seconds_since_last_discovery + elapsed, abs=0.01
    )
    assert page.locator("#q1-since-last").inner_text() == _duration(
        exp.seconds_since_last_discovery + elapsed
    )
    for kind, n in exp.created_in_window.items():
        assert page.locator(f'tr.q1-kind[data-kind="{kind}"] td').nth(2).inner_text() == str(n)
    # 2. oldest eligible, overall and per kind/lane/priority/version
    assert _value(page, "#q2-oldest") == pytest.approx(exp.oldest_eligible_age_s + elapsed, abs=0.01)
    assert page.locator("#q2-eligible").inner_text() == str(exp.eligible_items)
    assert page.locator("tr.q2-group").count() == len(exp.oldest_by_group)
    recheck = page.locator('tr.q2-group[data-lane="recheck"] td')
    assert [recheck.nth(i).inner_text() for i in range(5)] == ["article", "recheck", "5", "v2", "1"]
    # 3. lease expiries against the trailing week
    assert page.locator("#q3-last24h").inner_text() == str(exp.expiries_24h)
    assert page.locator("#q3-ratio").inner_text() == "6.0\N{MULTIPLICATION SIGN}"
    assert page.locator("#q3-unusual").is_visible()
    # 4. error classes by attempts spent
    top = page.locator("tr.q4-class").first
    assert top.get_attribute("data-class") == exp.top_error_class[1]
    assert top.locator("td").nth(2).inner_text() == str(exp.top_error_class[2])
    # 5. follow-ups
    assert page.locator("#q5-not-written").inner_text() == str(exp.published_not_written_back)
    assert page.locator("#q5-outbox").inner_text() == str(exp.outbox_pending)
    assert (
        page.locator("tr.q5-missing a", has_text="run").get_attribute("href")
        == "/dags/article_pipeline/runs/sheet__p2__v1"
    )
    # 6. active versions
    versions = {
        (row.get_attribute("data-version") or None): (
            row.locator("td").nth(1).inner_text(),
            row.locator("td").nth(2).inner_text(),
        )
        for row in page.locator("tr.q6-version").all()
    }
    assert versions == {v: (str(live), str(res)) for v, (live, res) in exp.versions.items()}


def test_a_missing_partition_shows_red(ops_page: Any, server: Server) -> None:
    cell = ops_page.locator(f'.partition-table[data-table="daily_sales"] [data-day="{server.missing_day}"]')
    assert cell.get_attribute("class") == "day missing"
    assert cell.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(229, 62, 62)"
    loaded = ops_page.locator(".partition-table .cal a.day.loaded").first
    assert loaded.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(56, 161, 105)"
    assert loaded.get_attribute("href").startswith("/dags/daily_sales/runs/scheduled__")
    assert ops_page.locator("#missing-daily_sales").inner_text() == "1"


def test_a_needs_review_row_links_to_its_review(ops_page: Any) -> None:
    link = ops_page.locator("tr.review-row a.review-link")
    assert link.count() == 1
    assert (
        link.get_attribute("href")
        == f"/dags/article_pipeline/runs/{REVIEW_RUN}/tasks/review/required_actions"
    )
    assert link.get_attribute("target") == "_top"  # out of the UI's iframe, into Airflow's page
    counts = {
        c.get_attribute("data-status"): c.inner_text() for c in ops_page.locator("td.queue-count").all()
    }
    assert counts == {"DONE": "1", "FAILED": "1", "INVALID": "1", "NEEDS_REVIEW": "1", "NEW": "1"}


def test_script_bearing_titles_urls_and_reasons_stay_text(ops_page: Any) -> None:
    assert ops_page.evaluate("() => window.__opsview_pwned") is None
    assert ops_page.dialogs == []
    assert ops_page.locator("script").count() == 0
    assert ops_page.locator("img").count() == 0  # the reason's <img onerror> is text
    hrefs = [a.get_attribute("href") or "" for a in ops_page.locator("a").all()]
    assert not [h for h in hrefs if h.strip().lower().startswith(("javascript:", "data:", "vbscript:"))]
    text = ops_page.locator("body").inner_text()
    assert SCRIPT_REASON in text  # shown as the characters the sheet holds
    assert SCRIPT_URL in text
    assert "<script>window.__opsview_pwned = 1</script>" in text


def test_published_articles_link_to_their_runs_and_logs(ops_page: Any, server: Server) -> None:
    rows = ops_page.locator("tr.article-row")
    assert rows.count() == server.expected.published_articles
    newest = rows.first  # p0, whose published URL is a javascript: URL: shown, not linked
    assert newest.locator("td").first.locator("a").count() == 0
    assert (
        newest.locator("a", has_text="log").get_attribute("href")
        == "/dags/article_pipeline/runs/sheet__p0__v1/tasks/publish?try_number=1"
    )
    second = rows.nth(1)
    assert (
        second.locator("td").first.locator("a").get_attribute("href")
        == "https://site.example/published/p1.html"
    )


def test_the_page_is_in_airflows_navigation(server: Server, browser: Any) -> None:
    status, raw, _ = _request(f"{server.url}/api/v2/plugins", token=server.tokens["admin"])
    assert status == 200
    views = [v for p in json.loads(raw)["plugins"] for v in p["external_views"]]
    assert {"name": "onceflow operations", "href": f"{PREFIX}/", "url_route": "onceflow-ops"}.items() <= next(
        v for v in views if v.get("url_route") == "onceflow-ops"
    ).items()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_cookies([{"name": "_token", "value": server.tokens["viewer"], "url": server.url}])
    page = context.new_page()
    page.goto(f"{server.url}/plugin/onceflow-ops")
    frame = page.frame_locator("iframe").first
    frame.locator("#q1").wait_for(timeout=60_000)  # the view inside Airflow's UI, as a viewer
    page.screenshot(path=str(SCREENSHOTS / "ops-view-in-airflow.png"))
    context.close()


# -- access ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
def test_anonymous_requests_get_401_and_no_data(server: Server, path: str) -> None:
    status, raw, _ = _request(f"{server.url}{path}")
    assert status == 401, raw
    assert _refusal_only(raw)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_user_without_a_role_gets_403_and_no_data(server: Server, path: str) -> None:
    for credentials in ({"token": server.tokens["norole"]}, {"cookie": server.tokens["norole"]}):
        status, raw, _ = _request(f"{server.url}{path}", **credentials)
        assert status == 403, raw
        assert _refusal_only(raw)


def test_a_forged_token_is_refused(server: Server) -> None:
    forged = server.tokens["admin"][:-4] + ("AAAA" if not server.tokens["admin"].endswith("AAAA") else "BBBB")
    status, _, _ = _request(f"{server.url}{PREFIX}/api/v1/questions", token=forged)
    assert status == 403


def test_a_viewer_reads_every_section(server: Server) -> None:
    for path in ENDPOINTS:
        status, raw, _ = _request(f"{server.url}{path}", token=server.tokens["viewer"])
        assert status == 200, (path, raw[:300])
    status, raw, _ = _request(f"{server.url}{PREFIX}/api/v1/questions", token=server.tokens["viewer"])
    doc = json.loads(raw)
    assert doc["follow_ups"]["published_not_written_back"] == server.expected.published_not_written_back


def test_a_query_dag_id_does_not_change_what_is_checked(server: Server) -> None:
    status, _, _ = _request(
        f"{server.url}{PREFIX}/api/v1/queue?dag_id=heartbeat", token=server.tokens["norole"]
    )
    assert status == 403


def test_metrics_take_the_scrape_token_or_an_airflow_user(server: Server) -> None:
    status, raw, headers = _request(f"{server.url}{PREFIX}/metrics", token=METRICS_TOKEN)
    assert status == 200, raw
    assert headers["content-type"].startswith("application/openmetrics-text")
    text = raw.decode()
    assert text.endswith("# EOF\n")
    assert "onceflow_ops_published_not_written_back 1" in text
    assert 'onceflow_ops_error_attempts{kind="article",error_class="FetchTimeout"} 10' in text
    assert _request(f"{server.url}{PREFIX}/metrics", token=METRICS_TOKEN + "x")[0] == 403
    assert _request(f"{server.url}{PREFIX}/metrics")[0] == 401
    assert _request(f"{server.url}{PREFIX}/metrics", token=server.tokens["norole"])[0] == 403
    assert _request(f"{server.url}{PREFIX}/metrics", token=server.tokens["viewer"])[0] == 200


def test_the_gauges_go_out_through_airflows_opentelemetry_metrics(server: Server) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        written_back = server.otel.find("onceflow_ops_published_not_written_back")
        attempts = server.otel.find("onceflow_ops_error_attempts")
        if written_back and attempts:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no onceflow_ops gauges reached the OTLP receiver: {sorted(server.otel.gauges)[:20]}")
    assert list(written_back.values()) == [server.expected.published_not_written_back]
    assert attempts[(("error_class", "FetchTimeout"), ("kind", "article"))] == 10


def test_the_dashboard_serves_only_its_own_files(server: Server) -> None:
    admin = server.tokens["admin"]
    status, raw, headers = _request(f"{server.url}{PREFIX}/dashboard/index.html", token=admin)
    assert status == 200 and b"Sales, last 30 days" in raw
    assert "script-src 'none'" in headers["content-security-policy"]
    for path in ("..%2Fpasswords.json", "..%2F..%2Fetc%2Fpasswd", "index.txt"):
        assert _request(f"{server.url}{PREFIX}/dashboard/{path}", token=admin)[0] == 404


def _refusal_only(raw: bytes) -> bool:
    """The body is Airflow's error document and nothing else (no section's data)."""
    return set(json.loads(raw)) == {"detail"} and b"<html" not in raw and b"work_key" not in raw


def _duration(seconds: float) -> str:
    from onceflow.opsview.page import duration

    return duration(seconds)


def test_the_sales_dashboard_is_on_the_page(ops_page: Any) -> None:
    frame = ops_page.frame_locator("iframe[title='sales dashboard']")
    assert frame.locator("h1").inner_text(timeout=10_000) == "Sales, last 30 days"
