"""Row model of the article queue: header-based column mapping, status cells, snapshots.

A sheet is read as a list of rows of strings (``values.batchGet`` with ``valueRenderOption=FORMULA``,
so formulas come back as the text the editor typed and are never evaluated by us). Row 1 is the
header; columns are found by header name, never by letter, so the editor may reorder them.

The status cell is the one cell the claim protocol writes conditionally, and it carries the claim
token for the rest of the row's life: ``NEW`` -> ``PROCESSING #<token>`` -> ``DONE #<token>``
(or ``NEEDS_REVIEW #<token>`` on the way, then DONE or ``REJECTED #<token>``).
See ``docs/sheet-queue.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

#: Columns the queue cannot work without. ``status`` carries the claim; ``reason`` receives the
#: explanation for INVALID/DUPLICATE rows and reconcile flags; ``run_id`` records the Airflow run;
#: ``score`` and ``published_url`` are written by the article chain.
REQUIRED_COLUMNS: tuple[str, ...] = ("url", "status", "reason", "run_id", "score", "published_url")
#: Columns filled when present (a readable copy of what the status cell already carries).
OPTIONAL_COLUMNS: tuple[str, ...] = ("claim_token", "claimed_at")


class Status(str, Enum):
    """The statuses the queue understands; any other status word is left untouched."""

    NEW = "NEW"
    PROCESSING = "PROCESSING"
    DONE = "DONE"
    FAILED = "FAILED"
    INVALID = "INVALID"
    DUPLICATE = "DUPLICATE"
    #: the translation scored below the threshold after polishing: the run waits for a reviewer.
    #: Not final: the row keeps its anchor (the decision is written through it) and its article.
    NEEDS_REVIEW = "NEEDS_REVIEW"
    #: a reviewer rejected the translation (final; the reviewer's note is the reason)
    REJECTED = "REJECTED"


#: Statuses meaning "this row owns its URL": a later NEW row with the same URL is a duplicate.
#: A REJECTED article keeps it too: its run id exists, and only a new processing version redoes it.
LIVE_STATUSES = frozenset(
    {Status.PROCESSING, Status.NEEDS_REVIEW, Status.DONE, Status.FAILED, Status.REJECTED}
)

#: Statuses of a claim still in flight: the row holds its anchor, and a run is (or should be)
#: driving it. NEEDS_REVIEW is one: its run waits for a reviewer's decision.
IN_FLIGHT_STATUSES = frozenset({Status.PROCESSING, Status.NEEDS_REVIEW})

#: Statuses after which nothing writes to the row again, so its anchor can go (NEEDS_REVIEW is
#: not: the reviewer's decision is still to be written through the anchor).
FINAL_STATUSES = frozenset({Status.DONE, Status.INVALID, Status.DUPLICATE, Status.FAILED, Status.REJECTED})

#: What a row's settling write may move it to: a final status, or NEEDS_REVIEW (its anchor kept).
SETTLED_STATUSES = FINAL_STATUSES | {Status.NEEDS_REVIEW}

_STATUS_RE = re.compile(r"^\s*([A-Za-z_]+)\s*(?:#([A-Za-z0-9._-]+))?\s*$")
_TOKEN_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# <time>-<hex>-<version>: the hex part has no "-", so everything after the second "-" is the version
_TOKEN_VERSION_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]+-([A-Za-z0-9_.-]{1,40})$")


class MissingColumnsError(ValueError):
    """The header row lacks columns the queue needs; the message names them."""

    def __init__(self, missing: list[str], header: list[str]) -> None:
        self.missing = missing
        super().__init__(
            f"sheet header is missing required column(s) {', '.join(repr(m) for m in missing)}; "
            f"found {header!r}. Add them to row 1 (names are case- and whitespace-insensitive)."
        )


def normalise_header(name: str) -> str:
    """``" Published URL "`` -> ``"published_url"``."""
    return re.sub(r"[\s-]+", "_", str(name).strip().lower())


@dataclass(frozen=True)
class ColumnMap:
    """Zero-based column index of every known column, found from the header row."""

    index: dict[str, int]

    @classmethod
    def from_header(cls, header: list[str]) -> ColumnMap:
        """Map header names to indexes; raise :class:`MissingColumnsError` naming what is missing.

        :param header: the first row of the sheet, as read.
        """
        index: dict[str, int] = {}
        for i, name in enumerate(header):
            key = normalise_header(name)
            if key and key not in index:  # the leftmost of two same-named columns wins
                index[key] = i
        missing = [c for c in REQUIRED_COLUMNS if c not in index]
        if missing:
            raise MissingColumnsError(missing, [str(h) for h in header])
        return cls(index)

    def __getitem__(self, name: str) -> int:
        return self.index[name]

    def has(self, name: str) -> bool:
        """Whether the header has the column."""
        return name in self.index


@dataclass(frozen=True)
class StatusCell:
    """A parsed status cell. ``status`` is None for words we do not know (left untouched)."""

    raw: str
    status: Status | None
    token: str | None

    @classmethod
    def parse(cls, raw: str) -> StatusCell:
        """Normalise stray whitespace and case: ``" new "`` is NEW, ``"Done #t1"`` is DONE with t1."""
        match = _STATUS_RE.match(raw or "")
        if not match:
            return cls(raw, None, None)
        word, token = match.group(1).upper(), match.group(2)
        try:
            status = Status(word)
        except ValueError:
            return cls(raw, None, None)
        if status is Status.NEW and token:  # "NEW #x" is not something we write: leave it alone
            return cls(raw, None, None)
        return cls(raw, status, token)


def status_value(status: Status, token: str) -> str:
    """The exact text written into a claimed row's status cell."""
    return f"{status.value} #{token}"


def new_token(now: datetime, random_hex: str, version: str | None = None) -> str:
    """A claim token: the claim time (so the lease is readable from the cell), randomness, and the
    processing version the row is claimed under (so every later repair uses the claim's own
    version, whatever version the repairer was started with).

    :param now: the claim time (aware).
    :param random_hex: unguessable suffix, e.g. ``secrets.token_hex(5)``.
    :param version: the claim's processing version (``v1``); ``None`` only for tests of old tokens.
    """
    token = f"{now.astimezone(timezone.utc).strftime(_TOKEN_TIME_FORMAT)}-{random_hex}"
    return f"{token}-{version}" if version else token


def token_time(token: str) -> datetime | None:
    """When the claim carrying ``token`` was made, or None if the token has no time part."""
    try:
        return datetime.strptime(token.split("-", 1)[0], _TOKEN_TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def token_version(token: str) -> str | None:
    """The processing version a claim was made under, or None for a token without one (claims
    made before tokens carried it, hand-typed tokens)."""
    match = _TOKEN_VERSION_RE.match(token or "")
    return match.group(1) if match else None


@dataclass(frozen=True)
class Row:
    """One data row as read. ``number`` is the 1-based sheet row at read time (a hint, not an id)."""

    number: int
    cells: dict[str, str]
    status_cell: StatusCell

    @property
    def url(self) -> str:
        """The row's ``url`` cell."""
        return self.cells.get("url", "")

    @property
    def status(self) -> Status | None:
        """The status in the row's status cell, or ``None``."""
        return self.status_cell.status

    @property
    def token(self) -> str | None:
        """The claim token in the row's status cell, or ``None``."""
        return self.status_cell.token

    def get(self, column: str) -> str:
        """The cell of ``column`` (empty when missing)."""
        return self.cells.get(column, "")


def make_row(columns: ColumnMap, number: int, raw: list[object]) -> Row:
    """A :class:`Row` from one row of values as the API returns it (ragged, trailing blanks trimmed)."""
    cells = {
        name: (str(raw[i]) if i < len(raw) and raw[i] is not None else "")
        for name, i in columns.index.items()
    }
    return Row(number, cells, StatusCell.parse(cells["status"]))


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of the queue tab (a single API call, so one point in time).

    ``anchors``: 1-based row number -> the claim anchors on that row, as (token, metadata id),
    when the read brought the rows' developer metadata (``None`` when it did not).
    """

    columns: ColumnMap | None
    rows: list[Row] = field(default_factory=list)
    anchors: dict[int, tuple[tuple[str, int], ...]] | None = None

    @classmethod
    def from_values(
        cls, values: list[list[object]], anchors: dict[int, tuple[tuple[str, int], ...]] | None = None
    ) -> Snapshot:
        """Build from ``values`` as returned by the API (ragged rows, trailing blanks trimmed).

        An entirely empty sheet is an empty queue; a header without the required columns raises
        :class:`MissingColumnsError`.
        """
        if not values or not any(str(v).strip() for v in values[0]):
            if any(any(str(v).strip() for v in row) for row in values[1:]):
                raise MissingColumnsError(list(REQUIRED_COLUMNS), [])
            return cls(None, [], anchors)
        columns = ColumnMap.from_header([str(v) for v in values[0]])
        rows = [make_row(columns, offset + 2, raw) for offset, raw in enumerate(values[1:])]
        return cls(columns, rows, anchors)

    def anchored(self, tokens: Iterable[str]) -> dict[str, list[Row]] | None:
        """Per token, every row anchored to it (as a by-anchor read of those tokens returns them);
        ``None`` when this read did not bring the rows' anchors."""
        if self.anchors is None or self.columns is None:
            return None
        wanted = set(tokens)
        by_number = {row.number: row for row in self.rows}
        found: dict[str, list[Row]] = {}
        for number in sorted(self.anchors):
            for token in dict.fromkeys(token for token, _ in self.anchors[number]):
                if token in wanted:
                    row = by_number.get(number) or make_row(self.columns, number, [])
                    found.setdefault(token, []).append(row)
        return found

    def extra_anchors(self, tokens: Iterable[str]) -> list[int]:
        """The metadata ids of the anchors of ``tokens`` beyond the first on each row (two copies
        of one claim batch applied, both replies lost); empty when the read brought no anchors."""
        wanted = set(tokens)
        extra: list[int] = []
        for pairs in (self.anchors or {}).values():
            seen: set[str] = set()
            for token, metadata_id in sorted(pairs, key=lambda pair: pair[1]):
                if token in wanted:
                    if token in seen:
                        extra.append(metadata_id)
                    seen.add(token)
        return extra

    def rows_with_token(self, token: str) -> list[Row]:
        """The rows that carry claim token ``token``."""
        return [r for r in self.rows if r.token == token]

    def by_token(self) -> dict[str, list[Row]]:
        """Rows grouped by the claim token they carry."""
        found: dict[str, list[Row]] = {}
        for row in self.rows:
            if row.token:
                found.setdefault(row.token, []).append(row)
        return found
