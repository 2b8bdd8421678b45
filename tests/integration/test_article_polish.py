"""Polish: the glossary tab read from the Sheets emulator with the real google-api-python-client,
substitutions on real Apertium output, and the score they raise."""

from __future__ import annotations

import logging

from onceflow.articles.polish import Polished, polish, read_glossary
from onceflow.articles.score import THRESHOLD, score_translation
from onceflow.articles.translate import translate_text
from onceflow.articles.translate.apertium import ApertiumTranslator
from onceflow.hooks.sheets import SheetQueueHook
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

QUEUE = [["url", "status"], ["http://127.0.0.1:8000/a.html", "NEW"]]
GLOSSARY = [
    ["Notes", "Source", "TARGET"],  # any column order and case; other columns ignored
    ["", "chiringuito", "beach bar"],
    ["", "botellón", "street drinking party"],
    ["", "empadronamiento", "municipal registration"],
    ["", "okupas", "squatters"],
    ["", "txistorra", "txistorra sausage"],
    ["", "cocido madrileño", "Madrid stew"],
]
# real Spanish whose local words Apertium's dictionary lacks
SPANISH = (
    "El empadronamiento de los vecinos del paseo marítimo se hará en el chiringuito de la playa. "
    "El concejal dijo que el botellón del sábado terminó sin heridos.\n\n"
    "Los okupas del antiguo hotel invitaron a los periodistas a probar la txistorra. "
    "Al final de la fiesta sirvieron un cocido madrileño."
)


def test_it_reads_the_glossary_tab_in_one_request_through_the_hook(sheets_emulator):
    sid = sheets_emulator.create_spreadsheet("queue", sheets={"queue": QUEUE, "glossary": GLOSSARY})
    sheets_emulator.request_log.reset()

    glossary = read_glossary(SheetQueueHook(spreadsheet_id=sid), sid)

    assert glossary == {row[1]: row[2] for row in GLOSSARY[1:]}
    assert list(glossary) == [row[1] for row in GLOSSARY[1:]]  # sheet order
    assert sheets_emulator.request_log.total == 1
    assert sheets_emulator.request_log["values.batchGet"] == 1


def test_it_reads_through_a_transport_too(sheets_emulator):
    sid = sheets_emulator.create_spreadsheet("queue", sheets={"queue": QUEUE, "terms": GLOSSARY[:2]})
    transport = GoogleSheetsTransport(anonymous_service(sheets_emulator.endpoint), sid)

    assert read_glossary(transport, sid, tab="terms") == {"chiringuito": "beach bar"}
    assert transport.calls["values.batchGet"] == 1


def test_a_missing_tab_is_an_empty_glossary_with_a_log_line(sheets_emulator, caplog):
    sid = sheets_emulator.create_spreadsheet("queue", sheets={"queue": QUEUE})
    sheets_emulator.request_log.reset()

    with caplog.at_level(logging.INFO, logger="onceflow.articles.polish"):
        glossary = read_glossary(sheets_emulator.hook(), sid)

    assert glossary == {}
    assert f"spreadsheet {sid} has no 'glossary' tab" in caplog.text
    assert sheets_emulator.request_log.total == 1


def test_bad_rows_are_reported_with_their_row_number_and_skipped(sheets_emulator, caplog):
    rows = [
        ["source", "target"],
        ["alcalde", "mayor"],
        ["concejal", ""],  # row 3: no target
        ["", "beach"],  # row 4: no source
        ["Alcalde", "major"],  # row 5: a duplicate (any case) with another target
        ["alcalde", "mayor"],  # row 6: the same pair again is harmless
        ['=HYPERLINK("http://x")', "x"],  # row 7: a formula
        ["", ""],  # blank rows are not errors
        ["playa", "beach"],
    ]
    sid = sheets_emulator.create_spreadsheet(
        "queue", sheets={"glossary": rows}, value_input_option="USER_ENTERED"
    )

    with caplog.at_level(logging.WARNING, logger="onceflow.articles.polish"):
        glossary = read_glossary(sheets_emulator.hook(), sid)

    assert glossary == {"alcalde": "mayor", "playa": "beach"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "glossary 'glossary' row 3 skipped: target is empty",
        "glossary 'glossary' row 4 skipped: source is empty",
        "glossary 'glossary' row 5 skipped: 'Alcalde' is already in row 2 with another target",
        "glossary 'glossary' row 7 skipped: a formula, not a term",
    ]


def test_a_tab_without_the_header_is_an_empty_glossary_with_an_error(sheets_emulator, caplog):
    sid = sheets_emulator.create_spreadsheet("queue", sheets={"glossary": [["alcalde", "mayor"]]})

    with caplog.at_level(logging.ERROR, logger="onceflow.articles.polish"):
        assert read_glossary(sheets_emulator.hook(), sid) == {}

    assert "needs a header row with 'source' and 'target' columns" in caplog.text


def test_substitutions_are_whole_word_and_keep_the_case():
    result = polish(
        "The ALCALDE met the alcalde and the Alcalde; alcaldes and subalcalde stay.",
        {"alcalde": "mayor"},
    )

    assert result == Polished(
        "The MAYOR met the mayor and the Mayor; alcaldes and subalcalde stay.", [("alcalde", "mayor", 3)]
    )


def test_unknown_marked_words_are_replaced_marker_and_all_and_longer_terms_win():
    result = polish(
        "The *chiringuito sells cooked *madrileño and Cocido madrileño.",
        {"madrileño": "from Madrid", "cocido madrileño": "Madrid stew", "chiringuito": "beach bar"},
    )

    assert result.text == "The beach bar sells cooked from Madrid and Madrid stew."
    assert result.substitutions == [
        ("madrileño", "from Madrid", 1),
        ("cocido madrileño", "Madrid stew", 1),
        ("chiringuito", "beach bar", 1),
    ]


def test_a_match_whose_lower_case_is_not_the_term_is_still_replaced():
    # re.IGNORECASE matches long s with "s" and a medial sigma with a final one, which str.lower()
    # does not map: the term lookup by lower() raised KeyError and failed the polish step on every
    # retry
    polished = polish("Una \u017fopa y el \u03bb\u03cc\u03b3\u03bf\u03c3.", {"sopa": "soup", "λόγος": "word"})

    assert polished.text == "Una soup y el word."
    assert sorted(polished.substitutions) == [("sopa", "soup", 1), ("λόγος", "word", 1)]


def test_polish_is_bounded_to_its_passes():
    chain = {"uno": "dos", "dos": "tres", "tres": "uno"}  # a cycle never settles

    assert polish("uno", chain).text == "dos"
    assert polish("uno", chain, max_passes=2).text == "tres"
    assert polish("uno", chain, max_passes=2).substitutions == [("uno", "dos", 1), ("dos", "tres", 1)]
    assert polish("uno", chain, max_passes=0).text == "uno"
    assert polish("nothing to do", chain, max_passes=50) == Polished("nothing to do", [])


def test_polishing_real_apertium_output_with_the_sheet_glossary_raises_the_score(sheets_emulator):
    sid = sheets_emulator.create_spreadsheet("queue", sheets={"queue": QUEUE, "glossary": GLOSSARY})
    translated = translate_text(ApertiumTranslator("spa-eng"), SPANISH, "es", "en", max_chars=10_000).text
    before = score_translation(SPANISH, translated, source_lang="es", target_lang="en")
    assert before.value < THRESHOLD and "*chiringuito" in translated

    polished = polish(translated, read_glossary(sheets_emulator.hook(), sid))
    after = score_translation(SPANISH, polished.text, source_lang="es", target_lang="en")

    assert "*" not in polished.text and "beach bar" in polished.text and "squatters" in polished.text
    # Apertium translated "cocido madrileño" itself, so that entry found nothing to replace
    assert [s[0] for s in polished.substitutions] == [
        "chiringuito",
        "botellón",
        "empadronamiento",
        "okupas",
        "txistorra",
    ]
    assert after.parts["known_words"] == 1.0
    assert after.value >= THRESHOLD > before.value
    assert polish(translated, read_glossary(sheets_emulator.hook(), sid)) == polished  # deterministic
