"""A review's attacks on the merged ``sheet_claim`` wake-up (the relay riding in the claim's read and
``batchUpdate``, issue 22), each against the emulator over HTTP (the real google-api-python-client)
and a SQLite ledger.

The attacks: the merged batch applied, its reply lost and the resend refused at the metadata cap;
the merged batch refused at the cap because the claim asks for more room than the relay's anchor
deletions free (the defect: the claim's retries went without those deletions, so the wake-up took
nothing, raised, and left the write-backs pending, and every later wake-up did the same; the first
and third tests fail on that code); an editor sorting, inserting or deleting rows between the
claim's read and its batch; a URL typed into a riding row between the applied batch and its
resend or read-back; the claim's part refused while the riding part is valid (the batch is
all-or-nothing: the riding part now goes alone at once); two wake-ups racing over the same
write-backs and rows; a 429 before the batch. A 500 after apply is in ``test_sheet_wakeup.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from sheet_outbox import link, publish_into_outbox, queue_of

from onceflow.ledger.outbox import pending_sheet_rows
from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.sheets.wakeup import wake_up
from onceflow.testing.sheet_edits import batch_update, delete_rows, insert_rows, set_row, sort_rows
from onceflow.testing.sheets_emulator.faults import Fault
from onceflow.testing.sheets_emulator.limits import usage

if TYPE_CHECKING:
    from onceflow.ledger import Ledger
    from onceflow.sheets.claim import Claim
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
K = 5


def _published(
    emulator: SheetsEmulator, ledger: Ledger, new_rows: int, *, new_on_top: bool = False
) -> tuple[str, list[Claim]]:
    """K rows claimed and published (their DONE waiting in the outbox), ``new_rows`` NEW below
    them (above them with ``new_on_top``)."""
    done = [[f"https://news.example.com/attack-{i}", "NEW"] for i in range(K)]
    new = [[f"https://news.example.com/attack-{K + i}", "LATER"] for i in range(new_rows)]
    sid = emulator.create_spreadsheet(
        "articles", sheets={"queue": [HEADER, *(new + done if new_on_top else done + new)]}
    )
    earlier = queue_of(emulator, sid).claim(K).claims
    assert len(earlier) == K
    sheet = emulator.server.store.spreadsheets[sid].sheet_by_title("queue")
    for i in range(1, len(sheet.rows)):
        if sheet.get(i, 1) == "LATER":
            sheet.set(i, 1, "NEW")
    publish_into_outbox(ledger, sid, earlier)
    return sid, earlier


def _rows(emulator: SheetsEmulator, sid: str) -> list[Any]:
    return Snapshot.from_values(emulator.values(sid, "queue")).rows


def _by_token(emulator: SheetsEmulator, sid: str) -> dict[str, Any]:
    return {r.token: r for r in _rows(emulator, sid) if r.token}


def _anchors(emulator: SheetsEmulator, sid: str) -> list[str]:
    book = emulator.server.store.spreadsheets[sid]
    return sorted(str(m.value) for m in book.all_metadata() if m.key == CLAIM_KEY)


def _used(emulator: SheetsEmulator, sid: str) -> int:
    return usage(emulator.server.store.spreadsheets[sid])[None]


def _promises(
    emulator: SheetsEmulator, ledger: Ledger, sid: str, earlier: list[Claim], claims: list[Claim]
) -> None:
    """What must hold after the wake-up: every write-back written (its row DONE with its own link,
    beside its own URL) and none left in the outbox, every claim handed out PROCESSING beside the
    URL it names, one anchor per row in flight and none on a final row."""
    rows = _by_token(emulator, sid)
    for claim in earlier:
        row = rows[claim.token]
        assert (row.status, row.get("published_url"), row.url) == (Status.DONE, link(claim), claim.url)
    for claim in claims:
        row = rows[claim.token]
        assert (row.status, row.number) == (Status.PROCESSING, claim.row_number) and row.url == claim.url
    in_flight = sorted(t for t, r in rows.items() if r.status is Status.PROCESSING)
    assert in_flight == sorted(c.token for c in claims), "no row in flight under a token no claim gave"
    assert _anchors(emulator, sid) == in_flight, "one anchor per row in flight, none at rest"
    assert pending_sheet_rows(ledger) == []


class _Hooked(GoogleSheetsTransport):
    """Runs an action just after its next ``spreadsheets.get`` (``after_read``) or just before its
    n-th ``spreadsheets.batchUpdate`` (``before_batch[n]``, from 1)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_read: Any = None
        self.before_batch: dict[int, Any] = {}
        self.batches = 0

    def read_grid(self, range_: str) -> Any:
        grid = super().read_grid(range_)
        action, self.after_read = self.after_read, None
        if action is not None:
            action()
        return grid

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.batches += 1
        action = self.before_batch.pop(self.batches, None)
        if action is not None:
            action()
        return super().batch_update(requests)


def _hooked(emulator: SheetsEmulator, sid: str) -> _Hooked:
    return _Hooked(anonymous_service(emulator.endpoint), sid)


def _edit(emulator: SheetsEmulator, sid: str, *requests: dict[str, Any]) -> None:
    batch_update(anonymous_service(emulator.endpoint), sid, *requests)


def test_at_the_metadata_cap_the_write_backs_make_room_for_the_claim_they_ride_in(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """The cap is full of the K published rows' anchors; 2K rows are NEW and the wake-up asks for
    2K. The merged batch (K deletions, 2K anchors) is refused whole. The claim then retried alone,
    without the deletions, so no anchor fitted: the wake-up raised, took nothing and wrote no
    write-back, and every later wake-up did the same (the rows' DONE never left the outbox, the
    queue stopped). A wake-up must leave with the write-backs written and K rows claimed."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, 2 * K)
    sheets_emulator.set_metadata_limit(_used(sheets_emulator, sid))  # full: K anchors in flight
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, 2 * K)
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and not woke.relayed.errors
    assert len(woke.claim.claims) == K, "the room the write-backs freed is claimed"
    _promises(sheets_emulator, sqlite_ledger, sid, earlier, woke.claim.claims)


def test_a_merged_batch_applied_its_reply_dropped_and_its_resend_refused_at_the_cap(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """The first copy frees K anchors and makes K; httplib2's resend frees none (gone already)
    and makes K more: over the cap, a 400. Both the claims and the write-backs are settled by
    the read-back: every claim handed out, every row written once, one anchor per claim."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, K)
    sheets_emulator.set_metadata_limit(_used(sheets_emulator, sid) + 10)
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K)
    assert sheets_emulator.request_log.snapshot()["faults"] == {"apply_then_drop": 1}
    assert len(woke.claim.claims) == K
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and not woke.relayed.errors
    _promises(sheets_emulator, sqlite_ledger, sid, earlier, woke.claim.claims)


def test_at_the_cap_the_write_backs_sent_alone_fail_after_applying_and_the_claim_still_fits(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """As above, and the write-backs' own batch (sent alone after the merged one was refused)
    gets a 500 after it applied: the read-back finds them written, the claim takes the room."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, 2 * K)
    sheets_emulator.set_metadata_limit(_used(sheets_emulator, sid))
    transport = _hooked(sheets_emulator, sid)
    transport.before_batch[2] = lambda: sheets_emulator.faults.add(
        "apply_then_fail", count=1, methods=["spreadsheets.batchUpdate"]
    )
    woke = wake_up(queue_of(sheets_emulator, sid, transport), sqlite_ledger, 2 * K)
    assert sheets_emulator.request_log.snapshot()["faults"] == {"apply_then_fail": 1}
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and not woke.relayed.errors
    assert len(woke.claim.claims) == K
    _promises(sheets_emulator, sqlite_ledger, sid, earlier, woke.claim.claims)


EDITS = {
    "sort descending": lambda sid: (sort_rows(0, 0, descending=True),),
    "insert a NEW row on top": lambda sid: (
        insert_rows(0, 1),
        set_row(0, 1, ["https://news.example.com/inserted", "NEW"]),
    ),
    "delete the top row": lambda sid: (delete_rows(0, 1, 2),),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_rows_moved_between_the_wake_ups_read_and_its_merged_batch(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger, edit: str
) -> None:
    """Every position the claim and the riding guards aim at now holds another row: claims land
    beside other URLs (handed out for the URL beside the token), the guards miss (the read-back
    finds the moves beside their own URLs)."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, 2 * K, new_on_top=True)
    transport = _hooked(sheets_emulator, sid)
    transport.before_batch[1] = lambda: _edit(sheets_emulator, sid, *EDITS[edit](sid))
    woke = wake_up(queue_of(sheets_emulator, sid, transport), sqlite_ledger, K)
    assert not transport.before_batch, "the editor acted between the read and the batch"
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and not woke.relayed.errors
    claims = woke.claim.claims
    assert len(claims) + woke.claim.lost == K and len(claims) >= K - 1
    kept = [
        c for c in earlier if c.url != "https://news.example.com/attack-0" or edit != "delete the top row"
    ]
    _promises(sheets_emulator, sqlite_ledger, sid, kept, claims)


def test_the_claims_part_refused_while_the_riding_part_is_valid(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """A grid cut to its rows; the editor deletes the last row (a NEW one the claim aims at)
    before the batch, so that row's anchor would be created past the grid's end: Google refuses
    the whole merged batch (400, nothing applied, the write-backs' moves with it). The write-backs
    then go in their own batch, the claim again alone from a fresh read (the emulator, like
    Google as far as documented, clips a ``findReplace``'s range to the grid: only an anchor past
    the end is refused, so the riding part is never refused while the claim's is valid)."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, K)
    sheet = sheets_emulator.server.store.spreadsheets[sid].sheet_by_title("queue")
    sheet.row_count = len(sheet.rows)  # no empty rows below the last one
    transport = _hooked(sheets_emulator, sid)
    last = len(sheet.rows)
    transport.before_batch[1] = lambda: _edit(sheets_emulator, sid, delete_rows(0, last - 1, last))
    woke = wake_up(queue_of(sheets_emulator, sid, transport), sqlite_ledger, K)
    assert not transport.before_batch
    assert transport.batches == 3, "refused merged batch, the write-backs alone, the claim alone"
    assert len(woke.claim.claims) == K - 1
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and not woke.relayed.errors
    _promises(sheets_emulator, sqlite_ledger, sid, earlier, woke.claim.claims)


@pytest.mark.parametrize("fault", ["apply_then_drop", "apply_then_fail"])
def test_a_url_typed_into_a_written_row_after_the_merged_batch_applied_and_its_reply_was_lost(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger, fault: str
) -> None:
    """The batch moved the row DONE beside its URL; the editor types another URL into it before
    the resend (or before the read-back of a 500). No reply says which URL the move saw, so the
    row is put back in flight under its claim for the new URL, its link cleared, its anchor back:
    never left DONE beside a URL whose article was not published."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, K)
    typed = earlier[2]

    def type_url(store: Any) -> None:
        store.get(sid).sheet_by_title("queue").set(typed.row_number - 1, 0, "https://news.example.com/typed")

    sheets_emulator.faults.add(
        Fault(fault, count=1, methods=["spreadsheets.batchUpdate"], after_apply=type_url)
    )
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K)
    assert len(woke.claim.claims) == K
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier if c is not typed)
    row = _by_token(sheets_emulator, sid)[typed.token]
    assert (row.url, row.status, row.get("published_url")) == (
        "https://news.example.com/typed",
        Status.PROCESSING,
        "",
    )
    assert sorted(_anchors(sheets_emulator, sid)) == sorted(
        [typed.token, *(c.token for c in woke.claim.claims)]
    )
    assert pending_sheet_rows(sqlite_ledger) == []


def test_two_wake_ups_race_over_the_same_write_backs_and_rows(
    sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger
) -> None:
    """Wake-up B runs whole between wake-up A's read and A's writes: A's fields (through anchors B
    deleted) land nowhere, its moves find the rows moved (its guards see them DONE beside their
    URLs), its claims find the rows taken. Each row written once, claimed once."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, 2 * K)
    transport = _hooked(sheets_emulator, sid)
    other: dict[str, Any] = {}
    transport.after_read = lambda: other.update(b=wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K))
    woke = wake_up(queue_of(sheets_emulator, sid, transport), sqlite_ledger, K)
    b = other["b"]
    assert sorted(b.relayed.written) == sorted(c.token for c in earlier) and len(b.claim.claims) == K
    assert woke.claim.claims == [] and woke.claim.lost == K
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier), "found written"
    _promises(sheets_emulator, sqlite_ledger, sid, earlier, b.claim.claims)


def test_a_429_then_the_merged_batch(sheets_emulator: SheetsEmulator, sqlite_ledger: Ledger) -> None:
    """A 429 applies nothing; the retry carries the same riding requests and fresh claim tokens."""
    sid, earlier = _published(sheets_emulator, sqlite_ledger, K)
    sheets_emulator.faults.add("429", count=1, methods=["spreadsheets.batchUpdate"], retry_after=0)
    woke = wake_up(queue_of(sheets_emulator, sid), sqlite_ledger, K)
    assert sheets_emulator.request_log.snapshot()["faults"] == {"429": 1}
    assert sorted(woke.relayed.written) == sorted(c.token for c in earlier) and len(woke.claim.claims) == K
    _promises(sheets_emulator, sqlite_ledger, sid, earlier, woke.claim.claims)
