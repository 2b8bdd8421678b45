"""Alert text per channel: untrusted values are neutralised, secrets redacted."""

from __future__ import annotations

from onceflow.watchdog.alerts import EMAIL, WEBHOOK, neutralise, render
from onceflow.watchdog.config import CheckConfig
from onceflow.watchdog.incidents import DOWN, Incident, Verdict

CELL = "https://news.example/a\r\nRunbook: https://evil.example/fix <!channel> <https://evil.example|Open runbook>"
CHECK = CheckConfig("sheet", "sheet_queue", 60, 60, "https://runbooks.example/sheet")
INCIDENT = Incident("sheet", DOWN, 2, 1, 0.0, 0.0, True, 0.0, 0, None, {})


def _render(channel: str, reason: str, evidence: dict[str, object]) -> str:
    return str(render(CHECK, INCIDENT, "down", Verdict(DOWN, reason, evidence), 0.0, channel)["text"])


def test_slack_text_escapes_mentions_links_and_newlines() -> None:
    text = _render(WEBHOOK, f"NEW row {CELL} waiting", {"oldest_url": CELL})
    lines = text.splitlines()
    assert len(lines) == 4  # title, reason, one evidence line, runbook: the cell added none
    assert lines[-1] == "Runbook: https://runbooks.example/sheet"
    assert "<!" not in text and "<http" not in text
    assert lines[2].startswith("• oldest_url: `") and lines[2].endswith("`")


def test_email_text_keeps_the_value_on_one_quoted_capped_line() -> None:
    long_cell = CELL + "x" * 5000
    text = _render(EMAIL, "NEW row waiting", {"oldest_url": long_cell})
    lines = text.splitlines()
    assert len(lines) == 4 and lines[-1] == "Runbook: https://runbooks.example/sheet"
    assert lines[2].startswith('• oldest_url: "') and lines[2].endswith('…"')
    assert len(lines[2]) < 400


def test_a_value_cannot_close_the_slack_code_span() -> None:
    assert neutralise("a` <!here> `b", WEBHOOK) == "`a' &lt;!here&gt; 'b`"


def test_secrets_in_reasons_and_evidence_are_redacted_in_text_and_facts() -> None:
    payload = render(
        CHECK,
        INCIDENT,
        "down",
        Verdict(DOWN, "GET http://u:PW-SECRET@api/health failed", {"url": "https://h/ping/HC-SECRET-1"}),
        0.0,
        WEBHOOK,
    )
    flat = str(payload)
    assert "PW-SECRET" not in flat and "HC-SECRET-1" not in flat
