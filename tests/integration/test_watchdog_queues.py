"""Queue age: the oldest NEW row in the sheet (Sheets API emulator, the real client) and the
oldest claimed article without a finished run (a real ledger), under a controlled clock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger import Ledger
from onceflow.ledger.db import create_ledger_engine
from onceflow.sheets.transport import anonymous_service
from onceflow.testing.alert_receiver import AlertReceiver
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog

if TYPE_CHECKING:
    from pathlib import Path

T0 = 1_800_000_000.0
HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]


def _config(tmp_path: Path, receiver: AlertReceiver, checks: dict[str, Any]) -> Any:
    return parse_config(
        {
            "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
            "state_dir": str(tmp_path / "state"),
            "alerts": {"webhook_url": receiver.webhook_url},
            "checks": checks,
        }
    )


def _kinds(receiver: AlertReceiver) -> list[tuple[str, str]]:
    return [(m["onceflow"]["check"], m["onceflow"]["kind"]) for m in receiver.webhooks()]


def test_the_oldest_new_row_is_aged_from_its_first_sighting_across_restarts(
    sheets_emulator: Any, tmp_path: Path
) -> None:
    sid = sheets_emulator.create_spreadsheet(
        "queue",
        sheets={"Queue": [HEADER, ["https://a.example/1", "NEW"], ["https://a.example/2", "DONE #t1"]]},
    )
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        sheet = {
            "kind": "sheet_queue",
            "endpoint": sheets_emulator.endpoint,
            "spreadsheet_id": sid,
            "range": "Queue!A:F",
            "max_age_seconds": 600,
            "grace_seconds": 300,
            "period_seconds": 60,
        }
        config = _config(tmp_path, receiver, {"sheet": sheet})
        clock = FakeClock(T0)
        reads_before = sheets_emulator.request_log["values.get"]
        assert Watchdog(config, clock=clock.now).run_once().states == {"sheet": "up"}
        clock.advance(700)
        assert Watchdog(config, clock=clock.now).run_once().states == {"sheet": "late"}
        clock.advance(300)  # a third watchdog process, same stored first sighting: down
        assert Watchdog(config, clock=clock.now).run_once().states == {"sheet": "down"}
        assert sheets_emulator.request_log["values.get"] - reads_before == 3  # one read per pass
        assert _kinds(receiver) == [("sheet", "down")]
        assert "https://a.example/1" in receiver.webhooks()[0]["text"]

        anonymous_service(sheets_emulator.endpoint).spreadsheets().values().update(
            spreadsheetId=sid, range="Queue!B2", valueInputOption="RAW", body={"values": [["PROCESSING #t2"]]}
        ).execute()
        clock.advance(60)
        assert Watchdog(config, clock=clock.now).run_once().states == {"sheet": "up"}
        assert _kinds(receiver) == [("sheet", "down"), ("sheet", "recovery")]
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM watchdog_seen")).scalar() == 0
        engine.dispose()
    finally:
        receiver.stop()


def test_an_unreadable_sheet_is_blindness_not_an_up(sheets_emulator: Any, tmp_path: Path) -> None:
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        sheet = {"kind": "sheet_queue", "endpoint": sheets_emulator.endpoint, "spreadsheet_id": "missing"}
        result = Watchdog(_config(tmp_path, receiver, {"sheet": sheet}), clock=FakeClock(T0).now).run_once()
        assert result.exit_code == 3
        assert "sheet" in result.blind and "sheet" not in result.states
    finally:
        receiver.stop()


def test_the_oldest_claimed_article_without_a_finished_run(tmp_path: Path) -> None:
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    clock = FakeClock(T0)
    engine = create_ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger = Ledger(engine, clock=clock)
    try:
        ledger.add("article", "article:row-1")
        clock.advance(1000)
        ledger.add("article", "article:row-2")
        ledger.add("fetch", "fetch:other-kind")  # not an article: ignored
        checks = {"articles": {"kind": "article_queue", "max_age_seconds": 3600, "grace_seconds": 600}}
        wd = Watchdog(_config(tmp_path, receiver, checks), clock=clock.now)
        assert wd.run_once().states == {"articles": "up"}
        clock.set(T0 + 3600 + 601)
        assert wd.run_once().states == {"articles": "down"}
        [alert] = receiver.webhooks()
        assert alert["onceflow"]["evidence"]["oldest_work_key"] == "article:row-1"
        lease = ledger.claim("article", "w1", lease_seconds=60, worker_version="v1")
        assert lease is not None and lease.work_key == "article:row-1"
        ledger.commit_result(lease, "read_claimed_row", {"ok": True})  # finished
        # row-2, claimed 1000 s later, is 3201 s old: up again
        assert wd.run_once().states == {"articles": "up"}
        assert _kinds(receiver) == [("articles", "down"), ("articles", "recovery")]
    finally:
        receiver.stop()
        engine.dispose()


HOSTILE = (
    "https://news.example/a\nRunbook: https://evil.example/fix <!channel> <https://evil.example|Open runbook>"
)


def test_a_hostile_sheet_cell_cannot_add_a_line_a_mention_or_a_link_to_the_alert(
    sheets_emulator: Any, tmp_path: Path
) -> None:
    """Anyone who can edit the sheet writes the URL cell: it reaches the alert only as inert text."""
    sid = sheets_emulator.create_spreadsheet("queue", sheets={"Queue": [HEADER, [HOSTILE, "NEW"]]})
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        sheet = {
            "kind": "sheet_queue",
            "endpoint": sheets_emulator.endpoint,
            "spreadsheet_id": sid,
            "range": "Queue!A:F",
            "max_age_seconds": 60,
            "grace_seconds": 60,
            "period_seconds": 60,
        }
        clock = FakeClock(T0)
        wd = Watchdog(_config(tmp_path, receiver, {"sheet": sheet}), clock=clock.now)
        wd.run_once()
        clock.advance(200)
        assert wd.run_once().states == {"sheet": "down"}
        (message,) = receiver.webhooks()
    finally:
        receiver.stop()
    text = message["text"]
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("Runbook:")] == [
        f"Runbook: {wd.config.checks[0].runbook}"
    ]
    assert "<!channel>" not in text and "<https://evil" not in text and "|Open runbook>" not in text
    assert "&lt;!channel&gt;" in text  # shown, escaped: the reader sees what was planted
    # every untrusted value sits inside backticks (Slack code: no link, no mention)
    for line in lines:
        if "evil.example" in line:
            inside = line.split("`")[1::2]
            assert any("evil.example" in part for part in inside), line
            assert all("evil.example" not in part for part in line.split("`")[0::2]), line
