"""The six answers, the partition calendar and the metrics for a seeded ledger, on SQLite and
PostgreSQL (the same queries run on both: the hour buckets differ per dialect)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from onceflow.opsview import metrics, partitions, questions
from onceflow.testing.ops_view_state import seed_ledger, seed_partitions

NOW = 1_764_000_000.0  # 2025-11-24 16:00 UTC, a fixed clock


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> sa.Engine:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = str(request.getfixturevalue("onceflow_postgres_url"))
    engine = sa.create_engine(url)
    yield engine
    engine.dispose()


def test_the_six_answers_match_the_seeded_ledger(engine: sa.Engine) -> None:
    exp = seed_ledger(engine, NOW)
    with engine.connect() as conn:
        doc = questions.all_questions(conn, NOW)

    disc = doc["discovery"]
    assert disc["seconds_since_last_discovery"] == pytest.approx(exp.seconds_since_last_discovery)
    assert {k["kind"]: k["created_in_window"] for k in disc["kinds"]} == exp.created_in_window
    assert disc["completed_in_window"] == exp.completed_in_window
    assert sum(disc["created_per_hour"]) == sum(exp.created_in_window.values())
    assert disc["created_per_hour"][-1] == 6  # r2, r3, r4, r5 and two partition loads in the last hour

    old = doc["oldest_eligible"]
    assert old["eligible_items"] == exp.eligible_items
    assert old["oldest_age_s"] == pytest.approx(exp.oldest_eligible_age_s)
    got = {
        (g["kind"], g["lane"], g["priority"], g["version"]): (g["items"], g["oldest_age_s"])
        for g in old["groups"]
    }
    assert got == exp.oldest_by_group  # whole seconds from a fixed clock: exact
    assert sum(b["items"] for b in old["histogram"]) == exp.eligible_items
    assert {b["bucket"]: b["items"] for b in old["histogram"] if b["items"]} == {
        "5-15m": 1,
        "15m-1h": 1,
        "1-6h": 1,
        "6-24h": 1,
        "1-5m": 1,
    }

    exp_doc = doc["lease_expiries"]
    assert exp_doc["last_24h"] == exp.expiries_24h
    assert exp_doc["trailing_week_daily_mean"] == pytest.approx(exp.expiries_week_daily_mean)
    assert exp_doc["ratio"] == pytest.approx(6.0)
    assert exp_doc["unusual"] is True
    assert sum(exp_doc["per_hour"]) == 7  # the 48 h chart also holds the week's first, 36 h ago
    assert exp_doc["by_event_24h"] == {"expire": 3, "reclaim_expired": 3}

    top = doc["error_classes"]["classes"][0]
    assert (top["kind"], top["error_class"], top["attempts"]) == exp.top_error_class
    assert [c["error_class"] for c in doc["error_classes"]["classes"]] == [
        "FetchTimeout",
        "TransientHTTPError",
    ]
    assert doc["error_classes"]["classes"][1]["retrying"] == 3

    fu = doc["follow_ups"]
    assert fu["outbox_pending_rows"] == exp.outbox_pending
    assert fu["published_not_written_back"] == exp.published_not_written_back
    assert fu["examples"][0]["work_key"] == "article:p2"
    assert fu["examples"][0]["run"]["run_url"] == "/dags/article_pipeline/runs/sheet__p2__v1"

    got_versions = {v["version"]: (v["live_items"], v["results"]) for v in doc["active_versions"]["versions"]}
    assert got_versions == exp.versions


def test_completions_and_discoveries_fall_in_their_hour(engine: sa.Engine) -> None:
    seed_ledger(engine, NOW)
    with engine.connect() as conn:
        disc = questions.discovery(conn, NOW, hours=48)
    # the last bucket is [now - 1 h, now]: p0 (exactly 1 h ago) and 2026-11-22's load (30 s ago);
    # p1 two hours ago falls in the one before
    assert disc["completed_per_hour"][-1] == 2
    assert disc["completed_per_hour"][-2] == 1
    assert disc["completed_per_hour"][-3] == 1


def test_an_empty_ledger_answers_without_errors(engine: sa.Engine) -> None:
    from onceflow.testing.ops_view_state import create_ledger

    create_ledger(engine)
    with engine.connect() as conn:
        doc = questions.all_questions(conn, NOW)
    assert doc["discovery"]["seconds_since_last_discovery"] is None
    assert doc["oldest_eligible"]["oldest_age_s"] is None
    assert doc["lease_expiries"]["ratio"] is None and doc["lease_expiries"]["unusual"] is False
    assert doc["active_versions"]["versions"] == []
    assert "# EOF" in metrics.openmetrics(doc)


def test_the_calendar_marks_missing_days_red_and_yesterday_due_before_its_deadline(engine: sa.Engine) -> None:
    tz = "Europe/Amsterdam"
    # 2025-11-24 06:30 Amsterdam: yesterday (the 23rd) is due at 07:00 today, not yet missing
    now = dt.datetime(2025, 11, 24, 5, 30, tzinfo=dt.timezone.utc).timestamp()
    days = [dt.date(2025, 11, d) for d in range(10, 23) if d != 15]
    seed_partitions(engine, "daily_sales", days)
    with engine.connect() as conn:
        cal = partitions.calendar(conn, "daily_sales", now, days=14, timezone=tz)
    states = {c["day"]: c["state"] for c in cal["cells"]}
    assert cal["first_day"] == "2025-11-10" and cal["last_day"] == "2025-11-23"
    assert states["2025-11-15"] == "missing"
    assert states["2025-11-23"] == "due"
    assert cal["missing"] == ["2025-11-15"]
    assert cal["todays_deadline"] == "2025-11-24T06:00:00+00:00" and not cal["todays_deadline_passed"]
    loaded = next(c for c in cal["cells"] if c["day"] == "2025-11-12")
    assert loaded["rows"] == 102 and loaded["run_url"].startswith(
        "/dags/daily_sales/runs/scheduled__2025-11-12"
    )
    assert loaded["log_url"].endswith("/tasks/load?try_number=1")
    with engine.connect() as conn:  # after 07:00 the 23rd is missing too
        later = partitions.calendar(conn, "daily_sales", now + 3600, days=14, timezone=tz)
    assert later["missing"] == ["2025-11-15", "2025-11-23"]


def test_a_bad_table_name_is_refused_before_any_query(engine: sa.Engine) -> None:
    with engine.connect() as conn, pytest.raises(ValueError, match="table"):
        partitions.calendar(conn, "daily_sales; DROP TABLE x", time.time(), days=3, timezone="UTC")
