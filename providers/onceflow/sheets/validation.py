"""Classify queue rows: which NEW rows are claimable, which are INVALID or DUPLICATE, and why.

Pure functions of one :class:`~onceflow.sheets.model.Snapshot`; nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.sheets.keys import InvalidUrl, normalise_url, row_key
from onceflow.sheets.model import LIVE_STATUSES, Row, Snapshot, Status


@dataclass(frozen=True)
class Verdict:
    """What a row is: claimable (``status`` None), or to be marked INVALID/DUPLICATE with a reason."""

    row: Row
    key: str | None
    normalised_url: str | None
    status: Status | None = None
    reason: str = ""
    first: Row | None = None  # for a DUPLICATE: the row that owns the URL

    @property
    def ok(self) -> bool:
        """Whether the row may be claimed (no refusal status)."""
        return self.status is None


def judge_url(row: Row) -> Verdict:
    """Validate the URL alone (no knowledge of other rows)."""
    try:
        url = normalise_url(row.url)
    except InvalidUrl as err:
        return Verdict(row, None, None, Status.INVALID, str(err))
    return Verdict(row, row_key(url), url)


def owners(snapshot: Snapshot, exclude_tokens: frozenset[str] = frozenset()) -> dict[str, Row]:
    """Row key -> first row (in sheet order) that already owns it: PROCESSING, DONE or FAILED.

    :param exclude_tokens: claims of the caller, which must not count as someone else's.
    """
    found: dict[str, Row] = {}
    for row in snapshot.rows:
        if row.status in LIVE_STATUSES and row.token not in exclude_tokens:
            verdict = judge_url(row)
            if verdict.key and verdict.key not in found:
                found[verdict.key] = row
    return found


def duplicate_reason(first: Row) -> str:
    """The reason written on a DUPLICATE row: which row holds the URL."""
    return f"duplicate of row {first.number} ({first.url.strip()[:200]})"


def classify_new_rows(snapshot: Snapshot) -> list[Verdict]:
    """Verdicts for every NEW row, in sheet order.

    A NEW row is a DUPLICATE when its URL is already owned by a claimed row, or by a NEW row
    above it (the first one in sheet order gets the article; later ones point at it).
    """
    seen = owners(snapshot)
    verdicts = []
    for row in snapshot.rows:
        if row.status is not Status.NEW:
            continue
        verdict = judge_url(row)
        key = verdict.key
        if verdict.ok and key is not None:
            first = seen.get(key)
            if first is not None:
                verdict = Verdict(
                    row, key, verdict.normalised_url, Status.DUPLICATE, duplicate_reason(first), first
                )
            else:
                seen[key] = row
        verdicts.append(verdict)
    return verdicts


def classify_claimed(snapshot: Snapshot, mine: dict[str, Row]) -> dict[str, Verdict]:
    """Re-judge the rows the caller actually won, as found in the verification read.

    The claimed row may not be the row that was aimed at (rows move), so it is judged afresh. When
    several live rows share a URL, the owner is decided by claim token (the earliest claim wins;
    tokens start with the claim time), which every concurrent claimer sees the same way whatever
    the row order: so two claimers can both keep a URL (Airflow then refuses the second run and
    reconcile marks the later row), but can never both give it up. Among the caller's own rows
    the first in sheet order keeps it.

    :param mine: claim token -> the row carrying it.
    """
    # key -> the foreign owner's rank: its token while it is PROCESSING (claims racing for one URL
    # are ordered by claim time, the same for every claimer), "" for a row that went further
    # (NEEDS_REVIEW, DONE, FAILED, REJECTED) or a hand-typed live status: it owns the URL whatever
    # its token, since a claim made within the same second could otherwise sort before it
    others: dict[str, str] = {}
    first_other: dict[str, Row] = {}
    for row in snapshot.rows:
        if row.status in LIVE_STATUSES and row.token not in mine:
            key = judge_url(row).key
            rank = row.token or "" if row.status is Status.PROCESSING else ""
            if key is not None and (key not in others or rank < others[key]):
                others[key] = rank
                first_other[key] = row
    judged = {token: judge_url(row) for token, row in mine.items()}
    my_min: dict[str, str] = {}
    for token, verdict in judged.items():
        if verdict.key is not None:
            my_min[verdict.key] = min(token, my_min.get(verdict.key, token))
    verdicts: dict[str, Verdict] = {}
    kept: dict[str, Row] = {}
    for token, row in sorted(mine.items(), key=lambda item: item[1].number):
        verdict = judged[token]
        key = verdict.key
        if verdict.ok and key is not None:
            if key in others and others[key] < my_min[key]:
                verdict = Verdict(
                    row, key, verdict.normalised_url, Status.DUPLICATE, duplicate_reason(first_other[key])
                )
            elif key in kept:
                verdict = Verdict(
                    row, key, verdict.normalised_url, Status.DUPLICATE, duplicate_reason(kept[key])
                )
            else:
                kept[key] = row
        verdicts[token] = verdict
    return verdicts
