"""``onceflow up``'s demo shop database: an existing shop.db is always a complete one."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import pytest

from onceflow import local_run
from onceflow.local_run import LocalRunConfig
from onceflow.sales.generator import write_orders

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from sqlalchemy.engine import Engine

    from onceflow.sales.generator import OrderRow


class SimulatedCrash(BaseException):
    """The process dying mid-generation (not an ``Exception``, so nothing on the way catches it)."""


def _config(tmp_path: Path) -> LocalRunConfig:
    cfg = LocalRunConfig(
        home=tmp_path, dags_folder=tmp_path / "dags", plugins_folder=tmp_path / "plugins", port=0, demo_days=2
    )
    cfg.data.mkdir(parents=True, exist_ok=True)
    return cfg


def _orders(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM orders").fetchone()[0])


def test_a_crash_during_generation_leaves_no_shop_db_and_the_next_run_regenerates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path)
    shop = cfg.data / "shop.db"

    def crash_after_create(engine: Engine, rows: Sequence[OrderRow], **kwargs: Any) -> int:
        write_orders(engine, rows[:0], **kwargs)  # create_all commits the empty table...
        raise SimulatedCrash  # ...then the process dies before the inserts

    monkeypatch.setattr("onceflow.sales.cli.write_orders", crash_after_create)
    with pytest.raises(SimulatedCrash):
        local_run._demo_orders(cfg)
    assert not shop.exists()
    assert (cfg.data / "shop.db.partial").exists()

    monkeypatch.undo()
    local_run._demo_orders(cfg)

    assert _orders(shop) > 0
    assert not (cfg.data / "shop.db.partial").exists()


def test_an_existing_shop_db_is_kept(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    local_run._demo_orders(cfg)
    shop = cfg.data / "shop.db"
    count, mtime = _orders(shop), shop.stat().st_mtime_ns

    local_run._demo_orders(cfg)

    assert _orders(shop) == count
    assert shop.stat().st_mtime_ns == mtime


def test_the_celery_banner_names_the_metadata_database_without_its_password(tmp_path: Path) -> None:
    cfg = LocalRunConfig(
        home=tmp_path,
        dags_folder=tmp_path / "dags",
        plugins_folder=tmp_path / "plugins",
        port=8080,
        demo_days=3,
        executor="celery",
        database_url="postgresql+psycopg2://airflow:s3cret@db.example:5432/airflow",
    )
    banner = local_run._banner(cfg, "http://127.0.0.1:8080", 8081, 8765)
    assert "postgresql+psycopg2://airflow:***@db.example:5432/airflow" in banner
    assert "s3cret" not in banner
    assert "SQLite" not in banner


def test_the_banner_hides_a_password_in_the_database_url_query(tmp_path: Path) -> None:
    cfg = LocalRunConfig(
        home=tmp_path,
        dags_folder=tmp_path / "dags",
        plugins_folder=tmp_path / "plugins",
        port=8080,
        demo_days=3,
        executor="celery",
        database_url="postgresql+psycopg2://airflow@db.example/airflow?password=QUERY-S3CRET&sslmode=require",
    )
    banner = local_run._banner(cfg, "http://127.0.0.1:8080", 8081, 8765)
    assert "QUERY-S3CRET" not in banner
    assert "db.example" in banner and "sslmode=require" in banner


def test_every_demo_row_names_a_page_the_demo_site_serves() -> None:
    from onceflow.testing.article_site.catalog import ARTICLES, FILES

    for path in local_run.DEMO_ARTICLE_PATHS:
        assert path in ARTICLES or path in FILES, f"the demo site does not serve {path}"


def _seeded_rows(tmp_path: Path) -> list[dict[str, str]]:
    import json

    seed = json.loads(local_run._demo_sheet(tmp_path / "sheet.json", 8765).read_text())
    header, *rows = seed["sheets"]["queue"]
    return [dict(zip(header, row, strict=True)) for row in rows]


def test_the_rows_that_fail_on_purpose_say_so_in_the_sheet_and_the_banner(tmp_path: Path) -> None:
    rows = _seeded_rows(tmp_path)
    on_purpose = {r["url"].rsplit("/", 1)[-1]: r["comment"] for r in rows if r["comment"]}
    assert set(on_purpose) == {"festa-major.html", "notes.pdf", "not a url"}
    assert all(c.startswith("fails on purpose") for c in on_purpose.values())
    assert "Catalan" in on_purpose["festa-major.html"] and "PDF" in on_purpose["notes.pdf"]
    banner = local_run._banner(_config(tmp_path), "http://localhost:8080", 8081, 8765)
    assert "red on purpose" in banner.lower() and "festa-major" in banner and "notes.pdf" in banner


def test_the_deployed_demo_sheet_asks_for_the_same_paths() -> None:
    import json
    from pathlib import Path as _Path

    deployed = json.loads((_Path(__file__).parents[2] / "deploy" / "demo-sheet.json").read_text())
    header, *rows = deployed["sheets"]["queue"]
    urls = [dict(zip(header, r, strict=True))["url"] for r in rows]
    assert [u.split(":8765", 1)[-1] for u in urls if "://" in u] == list(local_run.DEMO_ARTICLE_PATHS)


def test_the_local_run_environment_guards_the_api_and_uses_the_business_timezone(tmp_path: Path) -> None:
    env = local_run.environment(_config(tmp_path), api_port=8080, emulator_port=8090)
    assert env["ONCEFLOW_API_ALLOWED_HOSTS"].split(",") == ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"]
    assert env["ONCEFLOW_UI_DEFAULT_TIMEZONE"] == env["AIRFLOW__CORE__DEFAULT_TIMEZONE"] == "Europe/Amsterdam"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"


def test_the_local_settings_bind_the_log_servers_to_loopback(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    local_run._write_local_settings(cfg)
    text = (cfg.airflow_home / "config" / "airflow_local_settings.py").read_text()
    assert "bind_log_servers_to_loopback()" in text


def test_each_celery_worker_home_gets_the_loopback_settings(tmp_path: Path, monkeypatch: Any) -> None:
    """Under --executor celery a worker has a home of its own; its log server binds there
    (tests/acceptance/test_celery_log_server_loopback.py starts a real worker with the file)."""
    from onceflow.loopback_logs import serves_logs
    from onceflow.testing.celery_cluster import CeleryCluster

    monkeypatch.setattr(CeleryCluster, "start", lambda self, timeout: self)
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://postgres@127.0.0.1/x"}
    cluster = local_run._start_celery(_config(tmp_path), env, api_port=8080)
    assert len(cluster.worker_names) == 2
    for name in cluster.worker_names:
        text = (cluster.worker_home(name) / "config" / "airflow_local_settings.py").read_text()
        assert "bind_log_servers_to_loopback()" in text
    assert serves_logs(["airflow", "celery", "worker", "--queues", "q"])
    assert serves_logs(["airflow", "scheduler"]) and serves_logs(["airflow", "triggerer"])
    assert not serves_logs(["airflow", "celery", "flower"]) and not serves_logs(["airflow", "tasks"])


def test_the_ui_login_is_this_users_with_a_password_made_once_per_home(tmp_path: Path) -> None:
    import getpass
    import stat

    cfg = _config(tmp_path)
    user, password = local_run.login(cfg)
    assert user == getpass.getuser() and len(password) >= 16
    path = cfg.airflow_home / "simple_auth_manager_passwords.json.generated"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert local_run.login(cfg) == (user, password)  # the same on the next start
    env = local_run.environment(cfg, api_port=8080, emulator_port=8090, user=user)
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == f"{user}:admin"
    banner = local_run._banner(cfg, "http://localhost:8080", 8090, 8765, (user, password))
    assert password in banner and f"user {user!r}" in banner


def test_the_banners_backfill_command_loads_every_demo_day_from_a_utc_cli(tmp_path: Path) -> None:
    """The banner's CLI line runs outside ``make run`` (``[core] default_timezone`` UTC there): its
    dates must carry the business offset, or the first demo day is skipped (a bare date is 01:00)."""
    import datetime as dt
    import re
    import shlex

    from airflow._shared.timezones.timezone import parse
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import TimeRestriction

    from onceflow.sales.config import SalesConfig

    cfg = _config(tmp_path)
    banner = local_run._banner(cfg, "http://localhost:8080", 8081, 8765)
    command = re.search(r"airflow backfill create (.*?--to-date \S+)", banner.replace("\\\n", " "), re.S)
    assert command is not None, banner
    args = shlex.split(command.group(1))
    from_date, to_date = args[args.index("--from-date") + 1], args[args.index("--to-date") + 1]
    tz = SalesConfig.from_env().timezone
    core = coerce_to_core_timetable(CronDataIntervalTimetable("0 0 * * *", timezone=tz))
    info = core.next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=parse(from_date), latest=parse(to_date), catchup=True),
    )
    assert info is not None and info.data_interval is not None, (from_date, to_date)
    first_day = dt.date.today() - dt.timedelta(days=cfg.demo_days)
    assert info.data_interval.start.in_timezone(tz).date() == first_day, (from_date, to_date)


def test_local_settings_already_there_keep_their_content_and_get_the_call_once(tmp_path: Path) -> None:
    """The harness and `make run` add the loopback call to a file a benchmark or a user wrote."""
    from onceflow.loopback_logs import write_local_settings

    path = tmp_path / "config" / "airflow_local_settings.py"
    path.parent.mkdir()
    path.write_text("from onceflow.preload import preload_for_task_forks\n\npreload_for_task_forks()\n")
    write_local_settings(tmp_path)
    write_local_settings(tmp_path)
    text = path.read_text()
    assert text.startswith("from onceflow.preload import preload_for_task_forks\n")
    assert text.count("bind_log_servers_to_loopback()") == 1
    compile(text, str(path), "exec")  # still a valid module
