"""How an article's title goes into its run's note (``onceflow.run_notes.titled_note``) and where
it is found among the ledger's results (``article_label``). The listener against Airflow's
metadata DB is in ``tests/integration/test_run_notes.py``."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow.ledger.models import ResultRecord
from onceflow.operators.sheets import claim_note
from onceflow.run_notes import NOTE_MAX_CHARS, TITLE_CHARS, article_label, titled_note

URL = "https://news.example/a/huertos.html"


def test_the_title_goes_in_front_of_the_claim_line_once() -> None:
    note = titled_note("Los huertos", URL, claim_note(URL, 3))
    assert note == f"Los huertos — {URL} — claimed from row 3"
    assert titled_note("Los huertos", URL, note) == note, "idempotent"
    assert titled_note("Otro título", URL, note) == f"Otro título — {URL} — claimed from row 3"


def test_a_title_is_markdown_text_on_one_line() -> None:
    note = titled_note("=HYPERLINK(x)\n[Approve](https://evil.example) ![](t) <b>", URL, None)
    assert note == (
        "\\=HYPERLINK\\(x\\) \\[Approve\\]\\(https\\:\\/\\/evil\\.example\\) \\!\\[\\]\\(t\\) \\<b\\>"
        f" — {URL}"
    )


def test_text_that_does_not_start_with_the_url_is_kept_under_the_title_line() -> None:
    for kept in ("Ana: checked by hand", f"see {URL} again", f"two lines\n{URL} — claimed from row 2"):
        assert titled_note("T", URL, kept) == f"T — {URL}\n\n{kept}"
        assert titled_note("T", URL, f"T — {URL}\n\n{kept}") == f"T — {URL}\n\n{kept}"


def test_the_rest_of_a_multi_line_note_is_kept() -> None:
    note = f"{URL} — claimed from row 7\n\nmoved to row 9 by Ana"
    assert titled_note("T", URL, note) == f"T — {note}"


def test_no_title_no_note_and_no_url() -> None:
    assert titled_note("  \n ", URL, claim_note(URL, 3)) is None
    assert titled_note("T", "", None) == "T"
    assert titled_note("T", "", "T") == "T"


def test_the_note_stays_within_the_column() -> None:
    long_title = "palabra " * 100
    note = titled_note(long_title, URL, claim_note(URL, 3))
    assert note is not None and note.endswith(f"… — {URL} — claimed from row 3")
    assert len(note.split(" — ")[0]) <= TITLE_CHARS
    # a long note leaves less room: the title is cut shorter, then given up
    filler = "x" * (NOTE_MAX_CHARS - len(claim_note(URL, 3)) - 70)
    shorter = titled_note(long_title, URL, f"{claim_note(URL, 3)}\n{filler}")
    assert shorter is not None and len(shorter) <= NOTE_MAX_CHARS and len(shorter.split(" — ")[0]) <= 60
    assert titled_note(long_title, URL, "x" * (NOTE_MAX_CHARS - 10)) is None


def result(step: str, run_id: str, payload: dict[str, Any], token: int, at: float) -> ResultRecord:
    return ResultRecord(
        "article:k", step, "v1", token, payload, f"article_pipeline/{run_id}/1/{step}", at, []
    )


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        (
            [result("fetch", "r1", {"url": URL}, 1, 1), result("extract", "r1", {"title": "Mine"}, 2, 2)],
            ("Mine", URL),
        ),
        ([result("fetch", "r1", {"url": URL}, 1, 1)], None),  # ended before extract
        ([result("extract", "r1", {"title": ""}, 2, 2)], None),  # a page without a title
        (  # another run of the article replaced this run's results: its title, its URL
            [
                result("fetch", "r2", {"url": URL + "?2"}, 3, 3),
                result("extract", "r2", {"title": "Later"}, 4, 4),
            ],
            ("Later", URL + "?2"),
        ),
        (  # this run's title before a newer run's
            [
                result("extract", "r1", {"title": "Mine"}, 2, 2),
                result("extract", "r2", {"title": "Theirs"}, 4, 4),
                result("fetch", "r1", {"url": URL}, 1, 1),
            ],
            ("Mine", URL),
        ),
    ],
)
def test_the_label_is_the_runs_own_extract_title_and_fetch_url(
    records: list[ResultRecord], expected: tuple[str, str] | None
) -> None:
    assert article_label(records, "article_pipeline/r1/") == expected
