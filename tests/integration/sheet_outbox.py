"""Shared set-up of the wake-up tests (``test_sheet_wakeup*.py``): a queue on the emulator, and
claims published by the chain with their DONE waiting in the ledger's outbox."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceflow.ledger.steps import run_keyed_step
from onceflow.sheets.ledger_link import work_key
from onceflow.sheets.model import Status
from onceflow.sheets.protocol import SheetQueue
from onceflow.sheets.relay import row_write
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service

if TYPE_CHECKING:
    from collections.abc import Iterable

    from onceflow.ledger import Ledger
    from onceflow.sheets.protocol import Claim
    from onceflow.testing.sheets_fixtures import SheetsEmulator


def link(claim: Claim) -> str:
    """The published link of ``claim``'s article."""
    return f"https://pub.example/{claim.row_key}"


def queue_of(emulator: SheetsEmulator, sid: str, transport: Any = None) -> SheetQueue:
    transport = transport or GoogleSheetsTransport(anonymous_service(emulator.endpoint), sid)
    return SheetQueue(transport, spread=1)


def publish_into_outbox(ledger: Ledger, sid: str, claims: Iterable[Claim]) -> None:
    """Each claim's article published by its fenced ``publish`` step, its row's DONE (score, link,
    run id) committed with it into the outbox of tab ``queue``: what the relay then writes."""
    for claim in claims:
        fields = {"score": "0.90", "published_url": link(claim), "run_id": claim.run_id}
        write = row_write(f"{sid}/queue", claim.token, Status.DONE, fields, row_key=claim.row_key)
        run_keyed_step(
            ledger, kind="article", work_key=work_key(claim.row_key), step="publish", owner="chain",
            worker_version="v1", work=lambda _lease: {"ok": True}, follow_ups=lambda _r, w=write: [w],
        )  # fmt: skip
