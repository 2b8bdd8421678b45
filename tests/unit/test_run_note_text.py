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


@pytest.mark.parametrize(
    "typed",
    [
        f"NOT THIS ONE, see row 9: Title — {URL} — claimed from row 3",  # a person's words before our line
        f"Ana — {URL} is the wrong page",
        f"Ana: wrong — {URL}",
        f"{URL} is the wrong page",  # starts with the URL, but is not the claim's line
        f"{URL} — claimed from row 3 (moved to 9)",
    ],
)
def test_text_a_person_typed_around_the_url_is_kept_whole(typed: str) -> None:
    """Only a line provably ours is rewritten: anything else stays whole under the title line."""
    assert titled_note("Title", URL, typed) == f"Title — {URL}\n\n{typed}"
    assert titled_note("Title", URL, typed, by_person=True) == f"Title — {URL}\n\n{typed}"


def test_a_title_in_a_note_a_person_wrote_is_not_replaced() -> None:
    """Written by a person (``dag_run_note.user_id`` set), even a line of our exact shape may be
    their words: the new title goes on top; the same title changes nothing."""
    ours = f"Old — {URL} — claimed from row 3\n\nAna: checked"
    assert titled_note("New", URL, ours) == f"New — {URL} — claimed from row 3\n\nAna: checked"
    assert titled_note("New", URL, ours, by_person=True) == f"New — {URL}\n\n{ours}"
    assert titled_note("Old", URL, ours, by_person=True) == ours
    # a claim line with no title loses nothing when the title goes in front, whoever wrote it
    assert titled_note("New", URL, claim_note(URL, 3), by_person=True) == f"New — {claim_note(URL, 3)}"


def test_every_line_this_module_writes_takes_a_new_title() -> None:
    escaped = "Los \\[huertos\\] de 2025\\: Madrid…"
    for before, after in [
        (f"{escaped} — {URL} — claimed from row 3", f"T — {URL} — claimed from row 3"),
        (f"{escaped} — {URL}\n\nAna: typo", f"T — {URL}\n\nAna: typo"),
        (f"{escaped} — {URL}", f"T — {URL}"),
        # the claim note before titles, untitled and titled
        (
            f"{URL}\n\nClaimed from row 3 of the article queue sheet.",
            f"T — {URL}\n\nClaimed from row 3 of the article queue sheet.",
        ),
        (
            f"{escaped} — {URL}\n\nClaimed from row 3 of the article queue sheet.",
            f"T — {URL}\n\nClaimed from row 3 of the article queue sheet.",
        ),
    ]:
        assert titled_note("T", URL, before) == after, before


def test_no_url_known_titles_do_not_pile_up() -> None:
    """Without a URL the title line is ``<title>``, above a blank line when there was a note: the
    next title replaces it; a line alone may be anyone's and is kept."""
    first = titled_note("New", "", "Old")
    assert first == "New\n\nOld"
    assert titled_note("Newer", "", first) == "Newer\n\nOld"
    assert titled_note("Newer", "", titled_note("Newer", "", first)) == "Newer\n\nOld"
    assert titled_note("New", "", first) == first
    assert titled_note("Newer", "", first, by_person=True) == f"Newer\n\n{first}"
    assert titled_note("Newest", "", titled_note("Newer", "", "T")) == "Newest\n\nT"


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
        (  # another run's title never names this run (it ended before extract, or was replaced)
            [
                result("fetch", "r2", {"url": URL + "?2"}, 3, 3),
                result("extract", "r2", {"title": "Later"}, 4, 4),
            ],
            None,
        ),
        (
            [result("fetch", "r1", {"url": URL}, 1, 1), result("extract", "r2", {"title": "Theirs"}, 4, 4)],
            None,
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
