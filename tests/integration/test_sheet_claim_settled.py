"""Claims whose outcome is unknown are settled by reading back; a claim near the cap takes what fits.

Issue 22, defects 1 and 5. Real google-api-python-client against the Sheets emulator over HTTP;
every check reads the emulator's stored state (cells and developer metadata), not the queue's reads.

* Defect 1: the first copy of a claim batch is applied and its reply lost (``apply_then_drop``);
  httplib2 sends the batch again and the copy is refused with a 400 (here: the first copy's anchors
  filled the developer-metadata room). Treating that 400 as "nothing applied" left the rows
  ``PROCESSING #token`` under tokens that no claim returned.
* Defect 5: with room for fewer anchors than rows asked, the whole claim was refused; and a resent
  copy anchored every row a second time, eating the rows-in-flight budget.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.retry import Backoff
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheets_emulator.limits import size

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


def _setup(emulator: SheetsEmulator, n: int) -> tuple[SheetQueue, str]:
    urls = [f"https://news.example.com/settled/{i}" for i in range(n)]
    sid = emulator.create_spreadsheet("q", sheets={"queue": [HEADER, *([u, "NEW"] for u in urls)]})
    transport = GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)
    queue = SheetQueue(transport, backoff=Backoff(base=0.01, cap=0.05), rng=random.Random(5))
    queue.sheet_id()  # the tab ids first, so a fault aimed at batchUpdate hits the claim
    return queue, sid


def _anchors(emulator: SheetsEmulator, sid: str) -> list[Any]:
    return [m for m in emulator.server.store.spreadsheets[sid].all_metadata() if m.key == CLAIM_KEY]


def _processing(emulator: SheetsEmulator, sid: str) -> dict[str, str]:
    """token -> URL of every PROCESSING row, as stored."""
    snapshot = Snapshot.from_values(emulator.values(sid, "queue"))
    return {r.token: r.url for r in snapshot.rows if r.status is Status.PROCESSING and r.token}


def _anchor_chars(token_len: int) -> int:
    return len(CLAIM_KEY) + token_len


def test_defect1_a_resent_claim_refused_with_400_is_settled_by_reading_back(
    sheets_emulator: SheetsEmulator,
) -> None:
    queue, sid = _setup(sheets_emulator, 5)
    # room for exactly one copy's anchors: the resent copy is refused with Google's 400
    sample = len(queue.version) + 30  # a token: 16 chars of time, '-', 10 hex, '-', version
    one_copy = 5 * _anchor_chars(sample)
    sheets_emulator.set_metadata_limit(one_copy + 10)
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
    result = queue.claim(5)
    log = sheets_emulator.request_log.snapshot()
    assert log["faults"] == {"apply_then_drop": 1}
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] >= 2, "no resend: proves nothing"
    stored = _processing(sheets_emulator, sid)
    assert len(stored) == 5, "the first copy was applied"
    # every row the first copy took is handed out, under the token beside its own URL
    assert {c.token: c.url for c in result.claims} == stored
    assert {m.value for m in _anchors(sheets_emulator, sid)} == set(stored)


def test_defect5_a_claim_near_the_metadata_cap_takes_what_fits(sheets_emulator: SheetsEmulator) -> None:
    queue, sid = _setup(sheets_emulator, 50)
    token_len = len(queue.claim(1).claims[0].token)  # one row in flight, anchored
    per_anchor = _anchor_chars(token_len)
    used = sum(size(m) for m in _anchors(sheets_emulator, sid))
    # room for 31 more anchors, not for the 49 rows asked
    sheets_emulator.set_metadata_limit(used + 31 * per_anchor + per_anchor // 2)
    result = queue.claim(49)
    assert 0 < len(result.claims) <= 31
    assert len(result.claims) >= 16, "takes what fits, not a sliver of it"
    stored = _processing(sheets_emulator, sid)
    assert {c.token: c.url for c in result.claims}.items() <= stored.items()
    assert {m.value for m in _anchors(sheets_emulator, sid)} == set(stored)


def test_defect5_a_resent_claim_leaves_one_anchor_per_row(sheets_emulator: SheetsEmulator) -> None:
    queue, sid = _setup(sheets_emulator, 5)
    sheets_emulator.faults.add("apply_then_drop", count=1, methods=["spreadsheets.batchUpdate"])
    result = queue.claim(5)
    assert sheets_emulator.request_log["spreadsheets.batchUpdate"] >= 2, "no resend: proves nothing"
    assert len(result.claims) == 5
    values = sorted(m.value for m in _anchors(sheets_emulator, sid))
    assert values == sorted(c.token for c in result.claims), "each row anchored once"
