"""Pieces of the operations view that need no server: links, href safety, durations, metrics text,
and the plugin's promise to import nothing heavy outside the api-server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onceflow.opsview import links, metrics, page


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        ("article_pipeline/sheet__k__v1/2/fetch", ("article_pipeline", "sheet__k__v1", 2, "fetch")),
        (
            "daily_sales/scheduled__2026-11-22T00:00:00+00:00/1",
            ("daily_sales", "scheduled__2026-11-22T00:00:00+00:00", 1, "load"),
        ),
        ("host:dag.task.run.1", None),
        ("", None),
        (None, None),
    ],
)
def test_an_owner_names_its_run_and_task(
    owner: str | None, expected: tuple[str, str, int, str] | None
) -> None:
    ref = links.from_owner(owner, default_task="load")
    assert (None if ref is None else (ref.dag_id, ref.run_id, ref.try_number, ref.task_id)) == expected


def test_run_ids_are_quoted_in_links() -> None:
    ref = links.TaskRef("daily_sales", "manual__2026-01-01T00:00:00+00:00", 3, "load")
    assert ref.run_url == "/dags/daily_sales/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert ref.log_url == f"{ref.run_url}/tasks/load?try_number=3"
    assert ref.review_url() == f"{ref.run_url}/tasks/review/required_actions"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://site.example/a.html", True),
        ("http://127.0.0.1:8090/x", True),
        ("/dags/x/runs/y", True),
        ("javascript:alert(1)", False),
        (" JavaScript:alert(1)", False),
        ("data:text/html,<script>", False),
        ("//evil.example/", False),
        ("/\\evil.example/", False),
        ("https://ok.example/\nx", False),
        ("vbscript:x", False),
        ("", False),
        (None, False),
    ],
)
def test_only_http_urls_and_airflow_paths_become_links(url: str | None, allowed: bool) -> None:
    assert (page.safe_href(url) is not None) is allowed


def test_durations_read_in_two_units() -> None:
    assert [page.duration(s) for s in (None, 5, 75, 3600, 7260, 90000)] == [
        "-",
        "5s",
        "1m 15s",
        "1h 0m",
        "2h 1m",
        "1d 1h",
    ]


def test_openmetrics_escapes_label_values_and_ends_with_eof() -> None:
    doc = {
        "discovery": {"kinds": [], "completed_per_hour": [0]},
        "oldest_eligible": {"groups": []},
        "lease_expiries": {"last_24h": 0, "trailing_week_daily_mean": 0.0},
        "error_classes": {
            "classes": [{"kind": "a", "error_class": 'Bad"Class\\\n', "attempts": 3, "retrying": 1}]
        },
        "follow_ups": {"outbox_pending": [], "published_not_written_back": 0},
        "active_versions": {"versions": [{"version": None, "live_items": 2, "results": 0}]},
    }
    text = metrics.openmetrics(doc)
    assert 'onceflow_ops_error_attempts{kind="a",error_class="Bad\\"Class\\\\\\n"} 3' in text
    assert 'onceflow_ops_version_live_items{version=""} 2' in text
    assert text.count("# TYPE ") == len(metrics.HELP)
    assert text.endswith("# EOF\n")


def test_the_plugin_imports_no_api_code_until_the_api_server_mounts_it() -> None:
    code = (
        "import sys\n"
        "from onceflow.opsview.plugin import OnceflowOpsViewPlugin as P\n"
        "heavy = [m for m in ('onceflow.opsview.api', 'fastapi', 'airflow.api_fastapi.core_api.security') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "apps = list(P.fastapi_apps)\n"
        "assert [a['url_prefix'] for a in apps] == ['/onceflow-ops'], apps\n"
        "assert 'onceflow.opsview.api' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("days", ["0", "9999", "-3"])
def test_a_calendar_length_out_of_range_names_the_setting(monkeypatch: pytest.MonkeyPatch, days: str) -> None:
    from onceflow.opsview.sources import Settings

    monkeypatch.setenv("AIRFLOW__ONCEFLOW_OPS__CALENDAR_DAYS", days)
    with pytest.raises(ValueError, match=r"\[onceflow_ops\] calendar_days must be between 1 and 3660"):
        Settings.from_airflow()


def test_settings_split_the_table_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.opsview.sources import Settings

    monkeypatch.setenv("AIRFLOW__ONCEFLOW_OPS__TABLES", " daily_sales, returns ,")
    assert Settings.from_airflow().tables == ("daily_sales", "returns")


def test_rows_claimed_before_their_run_exists_render_without_links() -> None:
    """Claim first, then the run: a PROCESSING or NEEDS_REVIEW row may have no run id yet. The
    page rendered such a queue as a 500 (strict template, no ``run_url`` key), seen in make run."""
    from onceflow.opsview import access
    from onceflow.opsview.queue import sheet_queue

    values = [
        ["url", "status", "reason", "run_id", "score", "published_url"],
        ["https://example.test/a", "PROCESSING #20261202T000000Z-0000000001-v1", "", "", "", ""],
        ["https://example.test/b", "NEEDS_REVIEW #20261202T000000Z-0000000002-v1", "low", "", "0.5", ""],
        ["https://example.test/c", "PROCESSING #20261202T000000Z-0000000003-v1", "", "sheet__c__v1", "", ""],
    ]
    queue = sheet_queue(values, {}, 1_800_000_000.0)
    docs: dict[str, object] = {s.name: {"forbidden": True} for s in access.SECTIONS}
    docs["queue"] = queue
    html = page.render(docs, 1_800_000_000.0)
    assert "https://example.test/a" in html and "https://example.test/b" in html
    assert "no run id" in html  # the review row says why it has no review link
    assert html.count("sheet__c__v1") >= 1  # the row with a run still links it
