"""Bad watchdog configuration is refused at start, with a message naming the key and the value."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

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
    (
        ("grace_seconds = 5", "grace_secs = 5"),
        ["checks.heartbeat.grace_secs", "unknown key", "did you mean 'grace_seconds'", "value is not shown"],
    ),
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


# The review's configs that crashed with a traceback and exit 1, or were accepted and then failed.
ISSUE_28 = [
    ('webhook_url = "http://127.0.0.1:9/webhook"', 'webhook_url = "http://[::1/hook"', "alerts.webhook_url"),
    (
        'webhook_url = "http://127.0.0.1:9/webhook"',
        'webhook_url = "http://127.0.0.1:abc/webhook"',
        "alerts.webhook_url",
    ),
    ("grace_seconds = 5", "grace_seconds = 5\nsilences = 5", "checks.heartbeat.silences"),
    ("period_seconds = 10", "period_seconds = 1" + "0" * 320, "checks.heartbeat.period_seconds"),
    ('webhook_url = "http://127.0.0.1:9/webhook"', "", "no alert channel"),
    (
        'ledger_url = "sqlite:///{tmp}/ledger.db"',
        'ledger_url = "postgresql+nodriver://db/ledger"',
        "ledger_url",
    ),
]


@pytest.mark.parametrize(("old", "new", "key"), ISSUE_28, ids=[k for _, _, k in ISSUE_28])
def test_each_config_that_crashed_exits_2_naming_the_key_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, key: str
) -> None:
    from onceflow.watchdog.__main__ import main

    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    assert main(["--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err


def test_a_bogus_log_level_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onceflow.watchdog.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--config", str(_write(tmp_path, GOOD)), "--log-level", "bogus"])
    assert exited.value.code == 2
    assert "--log-level" in capsys.readouterr().err


SECRETS = [
    # (replacement, the secret that must not be printed) -- issue 30, item 2
    (
        (
            'ledger_url = "sqlite:///{tmp}/ledger.db"',
            'ledger_url = "postgres://watchdog:DB-PASSWORD-42@db/ledger"',
        ),
        "DB-PASSWORD-42",
    ),
    (
        (
            'webhook_url = "http://127.0.0.1:9/webhook"',
            'webhook_url = "http://127.0.0.1:9/webhook"\nwebhook_ulr = "https://hooks.slack.com/services/T0/B0/XOXB-SECRET"',
        ),
        "XOXB-SECRET",
    ),
    (
        (
            'webhook_url = "http://127.0.0.1:9/webhook"',
            'smtp_url = "smtp://alerts:SMTP-PW-7@mail:twenty"\nemail_to = ["a@b"]',
        ),
        "SMTP-PW-7",
    ),
    (
        (
            'webhook_url = "http://127.0.0.1:9/webhook"',
            'webhook_url = "ftp://hooks.example/services/T0/B0/XOXB-FTP-SECRET"',
        ),
        "XOXB-FTP-SECRET",
    ),
]


@pytest.mark.parametrize(("change", "secret"), SECRETS, ids=[s for _, s in SECRETS])
def test_config_errors_never_print_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], secret: str
) -> None:
    from onceflow.watchdog.__main__ import main

    path = _write(tmp_path, GOOD.replace(*change, 1))
    assert main(["--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and secret not in err, err


_KEYS = [
    ("loop_seconds",),
    ("ledger_url",),
    ("alerts", "webhook_url"),
    ("alerts", "max_attempts"),
    ("alerts", "send_timeout_seconds"),
    ("checks", "heartbeat", "period_seconds"),
    ("checks", "heartbeat", "grace_seconds"),
    ("checks", "heartbeat", "silences"),
    ("checks", "heartbeat", "enabled"),
    ("checks", "sales", "timezone"),
    ("checks", "sales", "deadline_cron"),
    ("status", "port"),
]


def _bad_values() -> Any:
    from hypothesis import strategies as st

    urls = st.builds(
        lambda scheme, host, port, secret: f"{scheme}://u:{secret}@{host}:{port}/x",
        st.sampled_from(["http", "ftp", "postgres", "", "h ttp"]),
        st.sampled_from(["127.0.0.1", "[::1", "", "exa mple"]),
        st.one_of(st.integers(-5, 70000).map(str), st.sampled_from(["abc", "", "1e3"])),
        st.just("HYPO-SECRET-9"),
    )
    return st.one_of(
        st.integers(min_value=-(10**400), max_value=-1),
        st.integers(min_value=10**12, max_value=10**400),
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not (0 < f < 1e6)),
        st.booleans(),
        st.text(max_size=20),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
        urls,
    )


def test_generated_wrong_values_exit_2_with_the_key_and_no_traceback(tmp_path: Path) -> None:
    """Hypothesis: a wrong type, range, URL, port or encoding at any of these keys exits 2, the
    message names the key, no traceback, no secret."""
    import io
    from contextlib import redirect_stderr

    import tomllib
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from onceflow.watchdog.__main__ import main

    base = tomllib.loads(GOOD.format(tmp=tmp_path))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(key=st.sampled_from(_KEYS), value=_bad_values(), latin1=st.booleans())
    def run(key: tuple[str, ...], value: Any, latin1: bool) -> None:
        doc = json_copy(base)
        node = doc
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
        try:
            text = "\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in doc.items())
        except (TypeError, ValueError):
            return  # not representable in TOML (a NaN key...): nothing a user could write
        path = tmp_path / "gen.toml"
        data = text.encode("utf-8")
        if latin1:
            data = data.replace(b"ledger_url", "l\u00e9dger_url".encode("latin-1"), 1)
        path.write_bytes(data)
        err = io.StringIO()
        with redirect_stderr(err):
            code = main(["--config", str(path), "--once"])
        out = err.getvalue()
        if code != 2:
            # A value that happens to be valid (a string timezone "UTC", a bool for enabled) runs a pass.
            assert not latin1 and "Traceback" not in out, out
            return
        assert "Traceback" not in out and "HYPO-SECRET-9" not in out, out
        assert latin1 or key[-1] in out or "no alert channel" in out or "not valid TOML" in out, (key, out)

    run()


def _toml(value: Any) -> str:
    """A TOML value (inline tables for tables): enough for the generated documents."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int | str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(type(value))


def json_copy(doc: Any) -> Any:
    import copy

    return copy.deepcopy(doc)
