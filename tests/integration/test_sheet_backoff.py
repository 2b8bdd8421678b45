"""Real 429s from the Sheets emulator make the queue wait, and the claims stay exactly-once.

The queue talks to the emulator through the real google-api-python-client. Each test injects
429s (with or without ``Retry-After``) or turns on the emulator's own quota, and checks the waits
two ways: the delays handed to the queue's ``Backoff.sleep`` (which really sleeps) and the arrival
times in the emulator's request timeline (a retry arrives no earlier than the sleep after the 429).
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.sheets.anchors import CLAIM_KEY
from onceflow.sheets.model import Snapshot, Status
from onceflow.sheets.protocol import Claim, SheetQueue
from onceflow.sheets.retry import Backoff, QuotaExceeded, QuotaExhausted
from onceflow.sheets.transport import GoogleSheetsTransport, anonymous_service
from onceflow.testing.sheet_races import run_claimers

if TYPE_CHECKING:
    from onceflow.testing.sheets_emulator.requestlog import RequestEvent
    from onceflow.testing.sheets_fixtures import SheetsEmulator

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
BATCH_UPDATE = "spreadsheets.batchUpdate"
WRITE_BY_FILTER = "values.batchUpdateByDataFilter"
BATCH_GET = "values.batchGet"
#: the claim's read: the tab id and its values in one spreadsheets.get
CLAIM_READ = "spreadsheets.get"


class RecordingSleep:
    """``Backoff.sleep`` that really sleeps and remembers each delay."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        time.sleep(seconds)


@dataclass(frozen=True)
class Sent:
    """One request as the client sent it: when, which method, and whether it was refused with 429."""

    at: float
    method: str
    refused: bool = False
    retry_after: float | None = None


class RecordingTransport(GoogleSheetsTransport):
    """The real transport, noting when each request was sent and the ``Retry-After`` of each 429."""

    def __init__(self, service: Any, spreadsheet_id: str) -> None:
        super().__init__(service, spreadsheet_id)
        self.sent: list[Sent] = []

    def _execute(self, method: str, request: Any) -> Any:
        sent_at = time.monotonic()
        try:
            reply = super()._execute(method, request)
        except QuotaExceeded as err:
            self.sent.append(Sent(sent_at, method, refused=True, retry_after=err.retry_after))
            raise
        except Exception:
            self.sent.append(Sent(sent_at, method))
            raise
        self.sent.append(Sent(sent_at, method))
        return reply


def _seed(emulator: SheetsEmulator, rows: int = 20) -> str:
    data = [HEADER] + [[f"https://news.example.com/story/{i}", "NEW"] for i in range(rows)]
    return emulator.create_spreadsheet("articles", sheets={"queue": data})


def _queue(
    emulator: SheetsEmulator,
    sid: str,
    sleep: RecordingSleep,
    *,
    base: float = 0.2,
    cap: float = 1.6,
    attempts: int = 8,
    seed: int = 1,
) -> SheetQueue:
    transport = RecordingTransport(anonymous_service(emulator.endpoint), sid)
    backoff = Backoff(attempts=attempts, base=base, cap=cap, sleep=sleep, rng=random.Random(seed))
    queue = SheetQueue(transport, backoff=backoff, rng=random.Random(seed))
    queue.sheet_id()  # the tab ids, fetched once, outside what the tests count
    return queue


def _retries(timeline: list[RequestEvent], method: str) -> list[tuple[RequestEvent, RequestEvent]]:
    """Each 429 of ``method`` paired with the next request of ``method`` (one client)."""
    events = [e for e in timeline if e.method == method]
    return [(a, b) for a, b in itertools.pairwise(events) if a.status == 429]


def _assert_exactly_once(emulator: SheetsEmulator, queue: SheetQueue, claims: list[Claim], rows: int) -> None:
    """Each claim's token is in exactly one row, beside its URL; no other token, and no anchor
    other than one per claim, is in the spreadsheet (a refused attempt left nothing behind)."""
    assert len({c.row_key for c in claims}) == len(claims), "a row was claimed twice"
    assert isinstance(queue.transport, GoogleSheetsTransport)
    snapshot = Snapshot.from_values(emulator.values(queue.transport.spreadsheet_id, "queue"))
    by_token = snapshot.by_token()
    assert set(by_token) == {c.token for c in claims}, "tokens in the sheet that no claim owns"
    for claim in claims:
        [row] = by_token[claim.token]
        assert row.status is Status.PROCESSING and row.url == claim.url
    assert sum(1 for r in snapshot.rows if r.status is Status.NEW) == rows - len(claims)
    found = queue.transport.search_metadata([{"developerMetadataLookup": {"metadataKey": CLAIM_KEY}}])
    assert sorted(m["metadataValue"] for m in found) == sorted(c.token for c in claims)


def test_a_429_with_retry_after_delays_the_claim_and_the_later_write(sheets_emulator: SheetsEmulator) -> None:
    sid = _seed(sheets_emulator)
    sleep = RecordingSleep()
    queue = _queue(sheets_emulator, sid, sleep)
    log = sheets_emulator.request_log
    log.reset()

    sheets_emulator.faults.add("429", count=1, retry_after=2, methods=[BATCH_UPDATE])
    result = queue.claim(5)
    assert len(result.claims) == 5 and result.lost == 0
    [(refused, retried)] = _retries(log.timeline, BATCH_UPDATE)
    assert refused.retry_after == "2" and retried.status == 200
    assert retried.at - refused.at >= 2.0, "the claim was resent before Retry-After"
    assert len(sleep.slept) == 1 and 2.0 <= sleep.slept[0] <= 2.0 + 0.2  # floor + jitter in [0, base]
    assert retried.at - refused.at >= sleep.slept[0]
    assert log[BATCH_UPDATE] == 2 and log.snapshot()["faults"] == {"429": 1}

    claim = result.claims[0]
    sheets_emulator.faults.add("429", count=1, retry_after=1, methods=[WRITE_BY_FILTER])
    row = queue.write_fields(claim.token, {"score": "0.9", "run_id": claim.run_id})
    [(refused, retried)] = _retries(log.timeline, WRITE_BY_FILTER)
    assert refused.retry_after == "1" and retried.status == 200
    assert retried.at - refused.at >= 1.0, "the write was resent before Retry-After"
    assert len(sleep.slept) == 2 and 1.0 <= sleep.slept[1] <= 1.0 + 0.2
    assert row.token == claim.token and row.get("score") == "0.9"

    _assert_exactly_once(sheets_emulator, queue, result.claims, 20)
    snapshot = Snapshot.from_values(sheets_emulator.values(sid, "queue"))
    assert [(r.token, r.get("run_id")) for r in snapshot.rows if r.get("score")] == [
        (claim.token, claim.run_id)
    ]


def test_retries_after_retry_after_are_jittered_not_a_fixed_delay(sheets_emulator: SheetsEmulator) -> None:
    sid = _seed(sheets_emulator)
    sleep = RecordingSleep()
    queue = _queue(sheets_emulator, sid, sleep, base=0.1, cap=0.4)
    log = sheets_emulator.request_log
    log.reset()

    sheets_emulator.faults.add("429", count=3, retry_after=1, methods=[BATCH_UPDATE])
    result = queue.claim(5)
    assert len(result.claims) == 5
    caps = [0.1, 0.2, 0.4]  # min(cap, base * 2**retry)
    assert len(sleep.slept) == 3
    for slept, cap in zip(sleep.slept, caps, strict=True):
        assert 1.0 < slept <= 1.0 + cap
    assert len(set(sleep.slept)) == 3, f"the same delay every time: {sleep.slept}"
    pairs = _retries(log.timeline, BATCH_UPDATE)
    assert len(pairs) == 3 and all(refused.retry_after == "1" for refused, _ in pairs)
    for (refused, retried), slept in zip(pairs, sleep.slept, strict=True):
        assert retried.at - refused.at >= slept  # the server saw each wait
    _assert_exactly_once(sheets_emulator, queue, result.claims, 20)


def test_a_429_without_retry_after_still_backs_off(sheets_emulator: SheetsEmulator) -> None:
    sid = _seed(sheets_emulator)
    sleep = RecordingSleep()
    queue = _queue(sheets_emulator, sid, sleep, base=0.1, cap=0.8)
    log = sheets_emulator.request_log
    sheets_emulator.faults.add("429", count=1, retry_after=None, methods=[BATCH_GET])
    with pytest.raises(QuotaExceeded) as refusal:
        queue.transport.read(["queue"])
    assert refusal.value.retry_after is None  # the emulator sent no Retry-After header
    log.reset()

    sheets_emulator.faults.add("429", count=4, retry_after=None, methods=[CLAIM_READ])
    result = queue.claim(5)
    assert len(result.claims) == 5
    assert len(sleep.slept) == 4 and sum(sleep.slept) > 0
    for slept, cap in zip(sleep.slept, [0.1, 0.2, 0.4, 0.8], strict=True):
        assert 0 < slept <= cap
    assert len(set(sleep.slept)) == 4
    pairs = _retries(log.timeline, CLAIM_READ)
    assert len(pairs) == 4 and all(refused.retry_after is None for refused, _ in pairs)
    for (refused, retried), slept in zip(pairs, sleep.slept, strict=True):
        assert retried.at - refused.at >= slept
    _assert_exactly_once(sheets_emulator, queue, result.claims, 20)


def test_an_exhausted_retry_budget_names_the_method_and_the_429(sheets_emulator: SheetsEmulator) -> None:
    sid = _seed(sheets_emulator)
    sleep = RecordingSleep()
    queue = _queue(sheets_emulator, sid, sleep, base=0.01, cap=0.05, attempts=3)
    queue.backoff.max_retry_after = 0.05  # honour Retry-After only up to 50 ms: a fast budget
    log = sheets_emulator.request_log
    log.reset()

    rule = sheets_emulator.faults.add("429", retry_after=0, methods=[BATCH_UPDATE])  # every claim write
    with pytest.raises(QuotaExhausted) as exhausted:
        queue.claim(5)
    message = str(exhausted.value)
    assert message.startswith("gave up after 3 attempts, all refused (")
    assert "last Retry-After 0 s): spreadsheets.batchUpdate: 429 " in message
    assert isinstance(exhausted.value, QuotaExceeded) and exhausted.value.attempts == 3
    assert exhausted.value.waited == pytest.approx(sum(sleep.slept))
    assert log[BATCH_UPDATE] == 3 and rule.fired == 3  # no outer retry multiplied the budget
    _assert_exactly_once(sheets_emulator, queue, [], 20)  # nothing was applied: no token, no anchor

    sheets_emulator.faults.clear()
    result = queue.claim(5)
    assert len(result.claims) == 5

    sheets_emulator.faults.add("429", methods=[WRITE_BY_FILTER])  # Retry-After 1 s by default
    with pytest.raises(QuotaExhausted, match=r"last Retry-After 1 s\): values.batchUpdateByDataFilter: 429 "):
        queue.write_fields(result.claims[0].token, {"score": "0.5"})
    sheets_emulator.faults.clear()
    sheets_emulator.faults.add("429", retry_after=None, methods=[CLAIM_READ])
    with pytest.raises(QuotaExhausted, match=r"last Retry-After none\): spreadsheets.get: 429 "):
        queue.claim(5)
    sheets_emulator.faults.clear()
    _assert_exactly_once(sheets_emulator, queue, result.claims, 20)
    assert not [r for r in Snapshot.from_values(sheets_emulator.values(sid, "queue")).rows if r.get("score")]


def test_claimers_under_the_emulators_own_quota_wait_as_told_and_claim_exactly_once(
    sheets_emulator: SheetsEmulator,
) -> None:
    rows, claimers = 30, 2
    sid = _seed(sheets_emulator, rows)
    queues = [_queue(sheets_emulator, sid, RecordingSleep(), seed=i) for i in range(claimers)]
    sheets_emulator.request_log.reset()
    sheets_emulator.set_quota(reads_per_minute=3, writes_per_minute=3, window=1.0)
    try:
        results = run_claimers(queues, 5, timeout=60)  # raises if a claimer raised
    finally:
        sheets_emulator.clear_quota()
    assert sheets_emulator.request_log.snapshot()["faults"].get("quota", 0) > 0, "the quota never bit"
    refusals = 0
    for claimer in queues:
        assert isinstance(claimer.transport, RecordingTransport)
        sent = claimer.transport.sent
        for this, after in itertools.pairwise(sent):
            if this.refused:
                refusals += 1
                assert this.retry_after is not None and this.retry_after >= 1.0, this
                assert after.at - this.at >= this.retry_after, f"{this.method} resent too early: {after}"
    assert refusals > 0
    _assert_exactly_once(
        sheets_emulator, queues[0], [c for rs in results for r in rs for c in r.claims], rows
    )
