"""``onceflow sales generate``: the sub-command the ``onceflow`` console script mounts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import sqlalchemy as sa

from onceflow.sales.cli import add_parser, main


def count(url: str) -> int:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        n = conn.execute(sa.text("SELECT count(*) FROM orders")).scalar_one()
    engine.dispose()
    return int(n)


def test_generate_writes_deterministic_orders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    args = ["sales", "generate", "--start", "2024-03-30", "--end", "2024-04-01", "--seed", "7"]
    assert main([*args, "--url", a]) == 0
    assert main([*args, "--url", b]) == 0
    assert "wrote" in capsys.readouterr().out
    assert count(a) == count(b) > 300


def test_ingested_before_leaves_out_the_late_rows(tmp_path: Path) -> None:
    full, cut = f"sqlite:///{tmp_path / 'full.db'}", f"sqlite:///{tmp_path / 'cut.db'}"
    args = ["sales", "generate", "--start", "2024-03-30", "--end", "2024-03-31", "--seed", "7"]
    main([*args, "--url", full])
    main([*args, "--url", cut, "--ingested-before", "2024-03-30T23:00:00Z"])
    assert 0 < count(cut) < count(full)


def test_it_mounts_on_another_parser_and_requires_an_offset() -> None:
    parser = argparse.ArgumentParser(prog="onceflow")
    add_parser(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(
            [
                "sales",
                "generate",
                "--url",
                "sqlite://",
                "--start",
                "2024-01-01",
                "--end",
                "2024-01-02",
                "--ingested-before",
                "2024-01-02T00:00:00",
            ]
        )
