"""A token found on two rows is re-tokened by a conditional write, and the claim is bound to the row
its token is on *after* that write (issue 22, defect 2).

A claim batch applied twice with an editor's insert between the copies (the first copy's reply
lost, the batch resent) puts one token on two rows. The re-token write used to aim by the row
number read back: if the editor inserted rows before it landed, it re-tokened the row the claim
was handed out for, and the token the claim hands out then sat beside another row's URL (that
row's ``write_done`` returned False). Real google-api-python-client against the Sheets emulator
over HTTP; the resend and the editor's inserts are made at the transport (a subclass that sends the
claim batch twice with the editor's insert between, as httplib2's resend would, and lets the editor
insert a row before the re-token write), because the point is the order of the requests.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from onceflow.articles.writeback import write_done
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.retry import Backoff
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_edits import batch_update, insert_rows, set_row

if TYPE_CHECKING:
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


class _ResentWithEdits(GoogleSheetsTransport):
    """Sends the first claim batch twice with an editor's insert between (a resend after a lost
    reply); before the next ``batchUpdate`` after that, the editor inserts another row on top."""

    def __init__(self, service: Any, sid: str, editor: Any) -> None:
        super().__init__(service, sid)
        self.editor = editor
        self.sid = sid
        self.stage = 0

    def _insert(self, url: str) -> None:
        batch_update(self.editor, self.sid, insert_rows(0, 1), set_row(0, 1, [url, "NEW"]))

    def batch_update(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        claim = any(
            str(r.get("findReplace", {}).get("replacement", "")).startswith("PROCESSING #")
            and r["findReplace"].get("find") == "NEW"
            for r in requests
        )
        if claim and self.stage == 0:
            self.stage = 1
            super().batch_update(requests)  # the first copy: applied, its reply lost
            self._insert("https://news.example.com/typed-in-between")
            return super().batch_update(requests)  # the resent copy
        if self.stage == 1:
            self.stage = 2
            self._insert("https://news.example.com/typed-before-the-retoken")
        return super().batch_update(requests)


def test_defect2_the_claim_hands_out_its_token_beside_the_url_it_is_on_after_a_retoken(
    sheets_emulator: SheetsEmulator,
) -> None:
    first = "https://news.example.com/first"
    sid = sheets_emulator.create_spreadsheet("q", sheets={"queue": [HEADER, [first, "NEW"]]})
    editor = anonymous_service(sheets_emulator.endpoint)
    transport = _ResentWithEdits(anonymous_service(sheets_emulator.endpoint), sid, editor)
    queue = SheetQueue(transport, backoff=Backoff(base=0.01, cap=0.05), rng=random.Random(2), spread=1)
    result = queue.claim(1)
    assert transport.stage == 2, "the resend and the re-token both happened: else this proves nothing"
    snapshot = Snapshot.from_values(sheets_emulator.values(sid, "queue"))
    for claim in result.claims:
        rows = snapshot.rows_with_token(claim.token)
        assert len(rows) == 1, f"{claim.token} on {len(rows)} rows"
        assert rows[0].url == claim.url, f"token handed out for {claim.url} sits beside {rows[0].url}"
        assert write_done(
            queue,
            claim.token,
            score=0.9,
            published_url="http://127.0.0.1/p",
            run_id="r",
            row_key=claim.row_key,
        )
    assert result.claims, "the claim won a row"
    # every PROCESSING row carries a token of its own
    tokens = [r.token for r in snapshot.rows if r.status is Status.PROCESSING]
    assert len(tokens) == len(set(tokens))
