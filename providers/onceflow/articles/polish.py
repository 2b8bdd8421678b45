"""Polish: glossary substitutions on a translation that scored low, read from the queue's sheet.

The editors keep a ``glossary`` tab in the queue's spreadsheet: a header row naming the columns
``source`` and ``target`` (any order, any case, other columns ignored), then one term per row.
:func:`read_glossary` reads it in one ``values.batchGet``; a missing tab is an empty glossary (a
log line says so); a bad row (a term without its translation, a duplicate with a different
translation, a formula) is logged with its row number and skipped, and the first row of a
duplicate wins.

:func:`polish` replaces whole words and phrases only (``gato`` is not replaced inside ``gatos``),
case-insensitively, keeping the case of what it replaces (``ALCALDESA`` -> ``MAYOR``, ``Alcaldesa``
-> ``Mayor``; a target written with capitals keeps them). A word Apertium marked unknown
(``*alcaldesa``) is replaced with its marker. Longer terms win over shorter ones that overlap;
one pass by default, at most ``max_passes`` (a later pass only sees what an earlier one wrote),
so the result is bounded and the same for the same input.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from onceflow.sheets.a1 import a1_sheet
from onceflow.sheets.retry import Refused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Polished:
    """The polished text, and ``(source term, target term, replacements)`` per term used."""

    text: str
    substitutions: list[tuple[str, str, int]] = field(default_factory=list)


def _transport(transport_or_hook: Any, spreadsheet_id: str) -> Any:
    from onceflow.sheets.transport import GoogleSheetsTransport

    if hasattr(transport_or_hook, "read"):  # a SheetsTransport
        retarget = getattr(transport_or_hook, "with_spreadsheet", None)
        if (
            retarget is not None
            and getattr(transport_or_hook, "spreadsheet_id", spreadsheet_id) != spreadsheet_id
        ):
            return retarget(spreadsheet_id)
        return transport_or_hook
    if callable(getattr(transport_or_hook, "transport", None)):  # a SheetQueueHook: shared resources
        return transport_or_hook.transport(spreadsheet_id)
    return GoogleSheetsTransport(transport_or_hook.get_conn(), spreadsheet_id)  # a GSheetsHook


def read_glossary(transport_or_hook: Any, spreadsheet_id: str, tab: str = "glossary") -> dict[str, str]:
    """The glossary tab as ``{source term: target term}``, in sheet order. One API request.

    :param transport_or_hook: a :class:`~onceflow.sheets.transport.SheetsTransport` or a
        ``GSheetsHook`` (e.g. :class:`~onceflow.hooks.sheets.SheetQueueHook`).
    :param spreadsheet_id: the queue's spreadsheet.
    :param tab: the glossary tab's title.
    """
    transport = _transport(transport_or_hook, spreadsheet_id)
    try:
        [rows] = transport.read([f"{a1_sheet(tab)}!A:Z"])
    except Refused as exc:
        if "Unable to parse range" not in str(exc):
            raise
        log.info("spreadsheet %s has no %r tab: polishing without a glossary", spreadsheet_id, tab)
        return {}
    if not rows:
        log.info("the %r tab of spreadsheet %s is empty: polishing without a glossary", tab, spreadsheet_id)
        return {}
    header = [str(cell).strip().lower() for cell in rows[0]]
    if "source" not in header or "target" not in header:
        log.error(
            "the %r tab of spreadsheet %s needs a header row with 'source' and 'target' columns (has %s): "
            "polishing without a glossary",
            tab,
            spreadsheet_id,
            rows[0],
        )
        return {}
    src, tgt = header.index("source"), header.index("target")
    glossary: dict[str, str] = {}
    seen: dict[str, tuple[int, str]] = {}  # lower-case term -> (row number, target) of its first row
    for number, row in enumerate(rows[1:], start=2):
        source = str(row[src]).strip() if src < len(row) else ""
        target = str(row[tgt]).strip() if tgt < len(row) else ""
        problem = None
        if not source and not target:
            continue
        if not source or not target:
            problem = f"{'target' if source else 'source'} is empty"
        elif source.startswith("=") or target.startswith("="):
            problem = "a formula, not a term"
        elif source.lower() in seen and seen[source.lower()][1] != target:
            problem = f"{source!r} is already in row {seen[source.lower()][0]} with another target"
        if problem:
            log.warning("glossary %r row %d skipped: %s", tab, number, problem)
            continue
        if source.lower() not in seen:
            seen[source.lower()] = (number, target)
            glossary[source] = target
    log.info("glossary %r: %d terms", tab, len(glossary))
    return glossary


def _match_case(found: str, replacement: str) -> str:
    letters = [c for c in found if c.isalpha()]
    if len(letters) > 1 and all(c.isupper() for c in letters):
        return replacement.upper()
    if letters and found[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def polish(
    translated: str, glossary: dict[str, str], *, max_passes: int = 1, unknown_marker: str = "*"
) -> Polished:
    """Apply ``glossary`` to ``translated``; see the module docstring.

    :param max_passes: passes at most (each one scan of the text); stops early when one changes nothing.
    :param unknown_marker: the backend's unknown-word marker, replaced along with the word.
    """
    terms: dict[str, tuple[str, str]] = {}
    for source, target in glossary.items():
        if source.strip():
            terms.setdefault(source.strip().lower(), (source, target))
    if not terms:
        return Polished(translated, [])
    order = sorted(terms, key=lambda k: (-len(k), k))
    alternatives = "|".join(re.escape(k) for k in order)
    pattern = re.compile(rf"(?<!\w)((?:{re.escape(unknown_marker)})?)({alternatives})(?!\w)", re.IGNORECASE)
    counts: dict[str, int] = {}

    def replace(match: re.Match[str]) -> str:
        key = match.group(2).lower()
        if key not in terms:
            # re's case-insensitive match is wider than lower() (long s matches "s", a medial
            # sigma matches a final one): the term is the first alternative, in the pattern's order, that
            # matches the found text, which is the one the pattern matched
            key = next(k for k in order if re.fullmatch(re.escape(k), match.group(2), re.IGNORECASE))
        counts[key] = counts.get(key, 0) + 1
        return _match_case(match.group(2), terms[key][1])

    text = translated
    for _ in range(max(0, max_passes)):
        text, n = pattern.subn(replace, text)
        if n == 0:
            break
    used = [(terms[k][0], terms[k][1], counts[k]) for k in terms if k in counts]
    return Polished(text, used)
