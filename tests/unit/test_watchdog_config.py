"""Bad watchdog configuration is refused at start, with a message naming the key and the value."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from onceflow.watchdog.config import ConfigError, load_config

if TYPE_CHECKING:
    from pathlib import Path

GOOD = """
ledger_url = "sqlite:///{tmp}/ledger.db"
warehouse_url = "sqlite:///{tmp}/warehouse.db"
state_dir = "{tmp}/state"

[alerts]
webhook_url = "http://127.0.0.1:9/webhook"

[checks.heartbeat]
period_seconds = 10
grace_seconds = 5

[checks.sales]
kind = "business_freshness"
table = "daily_sales"
deadline_cron = "0 7 * * *"
timezone = "Europe/Amsterdam"
"""

BAD = [
    # (replacement of a line of GOOD, expected words in the message)
    (("grace_seconds = 5", "grace_secs = 5"), ["checks.heartbeat.grace_secs", "unknown key", "5"]),
    (("grace_seconds = 5", "grace_seconds = -5"), ["checks.heartbeat.grace_seconds", "-5"]),
    (
        ('webhook_url = "http://127.0.0.1:9/webhook"', 'webhook_url = "ftp://127.0.0.1/webhook"'),
        ["alerts.webhook_url", "unsupported URL scheme", "ftp://127.0.0.1/webhook"],
    ),
    (
        ('deadline_cron = "0 7 * * *"', 'deadline_cron = "0 25 * * *"'),
        ["checks.sales.deadline_cron", "0 25 * * *"],
    ),
    (
        ('timezone = "Europe/Amsterdam"', 'timezone = "Europe/Atlantis"'),
        ["checks.sales.timezone", "unknown timezone", "Europe/Atlantis"],
    ),
    (('ledger_url = "sqlite', 'ledger_url = "mysql'), ["ledger_url", "unsupported URL scheme", "mysql"]),
    (('kind = "business_freshness"', 'kind = "vibes"'), ["checks.sales.kind", "vibes"]),
    # A check that can never go down (nan/inf is never exceeded), or a typo that means "on".
    (("grace_seconds = 5", "grace_seconds = nan"), ["checks.heartbeat.grace_seconds", "nan"]),
    (("period_seconds = 10", "period_seconds = inf"), ["checks.heartbeat.period_seconds", "inf"]),
    (("grace_seconds = 5", 'grace_seconds = 5\nenabled = "no"'), ["checks.heartbeat.enabled", "'no'"]),
    (
        ('webhook_url = "http://127.0.0.1:9/webhook"', 'smtp_url = "smtp://mail:twenty"\nemail_to = ["a@b"]'),
        ["alerts.smtp_url", "smtp://mail:twenty"],
    ),
    (
        # An integer would be opened as a file descriptor: the watchdog's own SQLite file.
        (
            "[checks.heartbeat]",
            '[checks.q]\nkind = "sheet_queue"\nendpoint = "http://127.0.0.1:9"\nspreadsheet_id = "s"\n'
            "credentials_file = 3\n\n[checks.heartbeat]",
        ),
        ["checks.q.credentials_file", "3"],
    ),
]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "watchdog.toml"
    path.write_text(text.format(tmp=tmp_path))
    return path


def test_the_good_config_loads(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD))
    assert [c.name for c in config.checks] == ["heartbeat", "sales"]
    assert config.checks[0].grace == 5.0
    assert str(config.checks[1].options["timezone"]) == "Europe/Amsterdam"


@pytest.mark.parametrize(("change", "words"), BAD, ids=[w[0] for _, w in BAD])
def test_bad_config_is_refused_naming_key_and_value(
    tmp_path: Path, change: tuple[str, str], words: list[str]
) -> None:
    old, new = change
    assert old in GOOD
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, GOOD.replace(old, new, 1)))
    for word in words:
        assert word in str(caught.value)


def test_the_cli_exits_2_and_prints_the_bad_key(tmp_path: Path) -> None:
    """The console script refuses to start: exit code 2, the message on stderr, nothing created."""
    path = _write(tmp_path, GOOD.replace("grace_seconds = 5", "grace_seconds = -1"))
    proc = subprocess.run(
        [sys.executable, "-m", "onceflow.watchdog", "--config", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "checks.heartbeat.grace_seconds" in proc.stderr and "-1" in proc.stderr
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "ledger.db").exists()


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("ledger_url = \n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_config(path)


def test_a_file_that_is_not_utf8_is_refused_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(_write(tmp_path, GOOD).read_text().replace("ledger", "l\u00e9dger", 1).encode("latin-1"))
    proc = subprocess.run(
        [sys.executable, "-m", "onceflow.watchdog", "--config", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "latin1.toml" in proc.stderr and "Traceback" not in proc.stderr


def test_an_unusable_state_dir_is_refused_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")  # state_dir under a regular file cannot be made
    path = _write(tmp_path, GOOD.replace('state_dir = "{tmp}/state"', 'state_dir = "{tmp}/file/state"'))
    proc = subprocess.run(
        [sys.executable, "-m", "onceflow.watchdog", "--config", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "state_dir" in proc.stderr and "file/state" in proc.stderr and "Traceback" not in proc.stderr
