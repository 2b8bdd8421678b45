"""onceflow.redact: the one helper that hides credentials in URLs, DSNs and free text."""

from __future__ import annotations

import logging

import pytest

from onceflow import redact
from onceflow.redact import MASK, RedactingFilter, redact_text, redact_url, register_secret


@pytest.fixture(autouse=True)
def _clean_registry():
    saved = set(redact._registered)
    yield
    redact._registered.clear()
    redact._registered.update(saved)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://watchdog:DB-PASSWORD-42@db/ledger", "postgres://watchdog:***@db/ledger"),
        ("postgresql+psycopg2://u:p%40ss@127.0.0.1:5432/x", "postgresql+psycopg2://u:***@127.0.0.1:5432/x"),
        ("smtp://alerts:SMTP-PW@mail.example:587", "smtp://alerts:***@mail.example:587"),
        (
            "https://hooks.slack.com/services/T000/B000/XOXB-SECRET-WEBHOOK-TOKEN",
            "https://hooks.slack.com/services/T000/B000/***",
        ),
        (
            "https://hc-ping.com/ping/0f2b1c3e-1111-4222-8333-944455556666",
            "https://hc-ping.com/ping/***",
        ),
        ("https://hc-ping.com/ping/PINGKEY/my-check", "https://hc-ping.com/ping/***"),
        ("https://discord.com/api/webhooks/123/TOKEN-x", "https://discord.com/api/webhooks/123/***"),
        (
            "http://127.0.0.1:9/db?user=a&password=s3cret&sslmode=require",
            "http://127.0.0.1:9/db?user=a&password=***&sslmode=require",
        ),
        ("http://x/hook?token=abc&access_key=def", "http://x/hook?token=***&access_key=***"),
        ("http://x/files/aB3dE5gH7jK9mN1pQ3sT5vW7", "http://x/files/***"),
        ("https://0123456789abcdef0123456789abcdef@sentry.example/1", "https://***@sentry.example/1"),
        # nothing secret: unchanged
        ("http://127.0.0.1:8080/webhook", "http://127.0.0.1:8080/webhook"),
        ("postgresql://postgres@127.0.0.1:5432/onceflow", "postgresql://postgres@127.0.0.1:5432/onceflow"),
        ("sqlite:////tmp/ledger.db", "sqlite:////tmp/ledger.db"),
    ],
)
def test_redact_url_hides_credentials_and_keeps_where_it_went(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_an_unparseable_url_is_still_redacted_not_raised() -> None:
    out = redact_url("http://admin:HUNTER2@[::1/hook")
    assert "HUNTER2" not in out
    assert "[::1" in out


def test_redact_text_finds_urls_and_key_value_pairs_in_an_error() -> None:
    err = repr(
        RuntimeError("http://h/services/T0/B0/XOXB-TOKEN answered 500; dsn host=db password=PW-9 user=x")
    )
    out = redact_text(err)
    assert "XOXB-TOKEN" not in out
    assert "PW-9" not in out
    assert "http://h/services/T0/B0/***" in out
    assert "answered 500" in out


def test_fencing_tokens_in_log_lines_are_not_mistaken_for_secrets() -> None:
    assert redact_text("commit refused: token=3 < 4") == "commit refused: token=3 < 4"


def test_a_registered_secret_is_replaced_wherever_it_appears() -> None:
    url = "http://127.0.0.1:8080/hook"
    register_secret(url)
    out = redact_text(f"POST {url} refused; retrying {url}")
    assert url not in out
    assert out.count("http://127.0.0.1:8080/***") == 2


def test_a_registered_url_also_registers_its_token_alone() -> None:
    register_secret("https://hooks.slack.com/services/T1/B1/ONLY-THE-TOKEN")
    assert "ONLY-THE-TOKEN" not in redact_text("the server said: bad token ONLY-THE-TOKEN")


def test_tiny_or_empty_values_are_not_registered() -> None:
    register_secret("")
    register_secret(None)
    register_secret("ab")
    assert redact_text("a b ab") == "a b ab"


def test_the_logging_filter_redacts_message_arguments_and_tracebacks() -> None:
    record = logging.LogRecord(
        "t", logging.WARNING, __file__, 1, "ping %s failed", ("http://x/ping/SECRET-UUID",), None
    )
    try:
        raise RuntimeError("boom at https://hooks.slack.com/services/T/B/TRACE-SECRET")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    assert record.getMessage() == f"ping http://x/ping/{MASK} failed"
    assert record.exc_text is not None
    assert "TRACE-SECRET" not in record.exc_text


def test_register_with_airflow_masks_in_the_task_log_masker() -> None:
    from airflow.sdk._shared.secrets_masker.secrets_masker import _secrets_masker

    register_secret("https://hc-ping.com/ping/HC-SECRET-UUID-1234", airflow=True)
    masked = _secrets_masker().redact("beat to https://hc-ping.com/ping/HC-SECRET-UUID-1234 ok")
    assert "HC-SECRET-UUID-1234" not in str(masked)
