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
