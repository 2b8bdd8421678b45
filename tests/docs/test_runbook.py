"""The runbook has an entry for everything the code can page or write on a row.

The lists come from the code, not from the runbook: the watchdog's check kinds and alert kinds,
the ledger's reconcile finding kinds (every ``Finding("<kind>", ...)`` under ``providers/onceflow``),
``sheet_reconcile``'s audit reasons (the module's string constants, which the audit tab shows
verbatim) and the row statuses an operator meets. A new one without its entry fails here.
"""

from __future__ import annotations

import ast
import re

from docs_site import REPO_ROOT

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
PACKAGE = REPO_ROOT / "providers" / "onceflow"
# Statuses of work going to plan: the runbook's row states are the ones someone has to look at.
UNEVENTFUL = {"NEW", "PROCESSING", "DONE"}


def _runbook() -> str:
    return RUNBOOK.read_text(encoding="utf-8")


def _prose() -> str:
    """The runbook with its lines joined, so a quoted reason may wrap."""
    return re.sub(r"\s+", " ", _runbook())


def _anchor(name: str) -> str:
    return "{#" + name.lower().replace("_", "-") + "}"


def _finding_kinds() -> set[str]:
    kinds = set()
    for path in PACKAGE.rglob("*.py"):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Finding"
                and node.args
            ):
                first = node.args[0]
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                    f"{path}:{node.lineno}: a Finding's kind must be a literal for this test to see it"
                )
                kinds.add(first.value)
    return kinds


def test_every_watchdog_check_kind_has_an_alert_entry() -> None:
    from onceflow.watchdog.config import CHECK_KINDS

    missing = [k for k in CHECK_KINDS if _anchor(f"alert-{k}") not in _runbook()]
    assert missing == []


def test_every_alert_kind_and_blindness_source_is_explained() -> None:
    from onceflow.watchdog.alerts import _TITLE

    text = _runbook()
    assert [k for k in _TITLE if f"`{k}`" not in text] == []
    assert _anchor("alert-flapping") in text and _anchor("alert-blind") in text
    # the fixed blindness sources (a check's own is watchdog.blind.<check name>)
    assert [s for s in ("ledger", "pass") if f"`watchdog.blind.{s}`" not in text] == []


def test_every_ledger_reconcile_finding_kind_is_in_the_runbook() -> None:
    kinds = _finding_kinds()
    assert {"expired_lease", "missing_follow_up", "stalled_relay", "missing_run"} <= kinds  # the scan works
    assert sorted(k for k in kinds if f"`{k}`" not in _runbook()) == []


def test_every_sheet_reconcile_reason_is_quoted_in_the_runbook() -> None:
    from onceflow.sheets import reconcile

    reasons = {
        name: value
        for name, value in vars(reconcile).items()
        if name.isupper() and isinstance(value, str) and " " in value
    }
    assert len(reasons) >= 15, sorted(reasons)  # the scan works
    prose = _prose()
    missing = {
        name: piece
        for name, text in reasons.items()
        for piece in re.split(r"\{[^}]*\}", text)
        if len(piece.strip()) > 3 and piece.strip() not in prose
    }
    assert missing == {}


def test_every_row_status_someone_must_look_at_has_an_entry() -> None:
    from onceflow.sheets.model import Status

    missing = [
        s.value for s in Status if s.value not in UNEVENTFUL and _anchor(f"row-{s.value}") not in _runbook()
    ]
    assert missing == []
