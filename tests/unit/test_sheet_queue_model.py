"""The sheet-queue domain without I/O: header mapping, statuses, URLs, keys, verdicts, reconcile plans."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from onceflow.sheets import reconcile
from onceflow.sheets.keys import InvalidUrl, normalise_url, pipeline_run_id, row_key
from onceflow.sheets.model import MissingColumnsError, Snapshot, Status, StatusCell, new_token, token_time
from onceflow.sheets.retry import Backoff, QuotaExceeded
from onceflow.sheets.validation import classify_claimed, classify_new_rows

HEADER = ["url", "status", "reason", "run_id", "score", "published_url"]
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)


def snap(*rows: list[str], header: list[str] = HEADER) -> Snapshot:
    return Snapshot.from_values([header, *[list(r) for r in rows]])


def test_columns_are_found_by_header_name_in_any_order_and_spelling() -> None:
    s = snap(
        ["NEW", "", "", "", "https://a.example/x"],
        header=["Status", "Reason", "Run ID", " score ", "URL", "Published URL"],
    )
    assert s.rows[0].url == "https://a.example/x"
    assert s.rows[0].status is Status.NEW


def test_a_missing_required_column_is_named_in_the_error() -> None:
    with pytest.raises(MissingColumnsError) as err:
        Snapshot.from_values([["url", "Status", "score"], ["https://a.example", "NEW"]])
    assert (
        "'reason'" in str(err.value) and "'published_url'" in str(err.value) and "'run_id'" in str(err.value)
    )
    assert err.value.missing == ["reason", "run_id", "published_url"]


def test_an_empty_sheet_is_an_empty_queue_but_rows_without_a_header_are_an_error() -> None:
    assert Snapshot.from_values([]).rows == []
    assert Snapshot.from_values([HEADER]).rows == []
    with pytest.raises(MissingColumnsError):
        Snapshot.from_values([[], ["https://a.example", "NEW"]])


@pytest.mark.parametrize(
    ("raw", "status", "token"),
    [
        ("NEW", Status.NEW, None),
        (" new ", Status.NEW, None),
        ("New\t", Status.NEW, None),
        ("processing #20260105T120000Z-ab12", Status.PROCESSING, "20260105T120000Z-ab12"),
        ("DONE #t-1", Status.DONE, "t-1"),
        ("HOLD", None, None),
        ("new please", None, None),
        ('=IF(1,"NEW")', None, None),
        ("NEW #x", None, None),
        ("", None, None),
    ],
)
def test_status_cells_are_normalised_and_unknown_words_are_not_ours(
    raw: str, status: Status | None, token: str | None
) -> None:
    cell = StatusCell.parse(raw)
    assert (cell.status, cell.token, cell.raw) == (status, token, raw)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("  https://News.Example.com/a?b=1#frag ", "https://news.example.com/a?b=1"),
        ("HTTP://example.com:80", "http://example.com/"),
        ("https://example.com:8443/x", "https://example.com:8443/x"),
    ],
)
def test_urls_are_normalised(url: str, expected: str) -> None:
    assert normalise_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "empty URL"),
        ("   ", "empty URL"),
        ('=HYPERLINK("https://x.example")', "formula-like"),
        ("+cmd|' /C calc'!A0", "formula-like"),
        ("ftp://example.com/a", "http:// or https://"),
        ("https://", "no valid host"),
        ("https://exa mple.com", "whitespace"),
        ("https://[::1", "malformed"),
        ("example.com/a", "http:// or https://"),
        ("https://user:pw@example.com/", "credentials"),
    ],
)
def test_bad_urls_are_rejected_with_a_reason(url: str, reason: str) -> None:
    with pytest.raises(InvalidUrl, match=reason.replace("+", r"\+").replace("|", r"\|")):
        normalise_url(url)


def test_the_row_key_depends_on_the_normalised_url_only_and_the_run_id_on_key_and_version() -> None:
    a = row_key(normalise_url("https://Example.com/a#x"))
    assert a == row_key(normalise_url(" https://example.com/a"))
    assert a != row_key(normalise_url("https://example.com/b"))
    assert pipeline_run_id(a, "v1") == f"sheet__{a}__v1" != pipeline_run_id(a, "v2")
    with pytest.raises(ValueError):
        pipeline_run_id(a, "v 1")


def test_tokens_carry_the_claim_time() -> None:
    token = new_token(T0, "abcdef")
    assert token == "20260105T120000Z-abcdef"
    assert token_time(token) == T0
    assert token_time("handmade") is None


def test_new_rows_are_judged_invalid_duplicate_or_claimable() -> None:
    s = snap(
        ["https://a.example/1", "NEW"],
        ["", "NEW"],
        ["https://b.example/1", "DONE #20250101T000000Z-x"],
        ["https://A.example/1#top", " new"],
        ["https://b.example/1", "NEW"],
        ["https://c.example/1", "HOLD"],
    )
    verdicts = {v.row.number: v for v in classify_new_rows(s)}
    assert set(verdicts) == {2, 3, 5, 6}, "only NEW rows are judged; HOLD is left alone"
    assert verdicts[2].ok
    assert (verdicts[3].status, verdicts[3].reason) == (Status.INVALID, "empty URL")
    assert verdicts[5].status is Status.DUPLICATE and verdicts[5].reason.startswith("duplicate of row 2")
    assert verdicts[6].status is Status.DUPLICATE and "row 4" in verdicts[6].reason


def test_concurrent_claims_of_one_url_never_both_give_it_up() -> None:
    # two claimers each won a row with the same URL; each judges with the other's token visible
    early, late = "20260105T120000Z-aaaa", "20260105T120000Z-bbbb"
    s = snap(["https://a.example/1", f"PROCESSING #{late}"], ["https://a.example/1", f"PROCESSING #{early}"])
    mine_late = classify_claimed(s, {late: s.rows[0]})
    mine_early = classify_claimed(s, {early: s.rows[1]})
    assert mine_late[late].status is Status.DUPLICATE
    assert mine_early[early].ok


def _plan(s: Snapshot, states: dict[str, str], audit: list[dict[str, str]] | None = None) -> reconcile.Plan:
    return reconcile.plan(
        s, now=T0, lease=timedelta(minutes=30), version="v1", run_state=states.get, audit=audit or []
    )


def test_reconcile_redrives_only_expired_claims_without_an_active_run() -> None:
    old, fresh = "20260105T100000Z-aa", "20260105T115500Z-bb"
    s = snap(
        ["https://a.example/1", f"PROCESSING #{old}"],
        ["https://a.example/2", f"PROCESSING #{fresh}"],
        ["https://a.example/3", f"PROCESSING #{old}x"],
        ["https://a.example/4", f"PROCESSING #{old}y"],
    )
    run = {i: pipeline_run_id(row_key(normalise_url(f"https://a.example/{i}")), "v1") for i in range(1, 5)}
    plan = _plan(s, {run[3]: "running", run[4]: "failed"})
    assert [(a.kind, a.run_id) for a in plan.actions] == [("create_run", run[1]), ("reset_run", run[4])]


def test_reconcile_gives_up_after_repeated_failures_and_flags_once() -> None:
    old = "20260105T100000Z-aa"
    s = snap(
        ["https://a.example/1", f"PROCESSING #{old}"],
        ["https://a.example/2", "DONE #20260105T100000Z-cc"],
        ["https://a.example/3", "HOLD", "", "", "", "https://pub.example/3"],
    )
    run = pipeline_run_id(row_key(normalise_url("https://a.example/1")), "v1")
    redrive = {
        "action": "reset_run",
        "reason": reconcile.REDRIVE_FAILED,
        "claim_token": old,
        "url": "https://a.example/1",
    }
    plan = _plan(s, {run: "failed"}, [redrive] * 3)
    kinds = sorted((a.kind, a.reason) for a in plan.actions)
    assert ("transition", reconcile.GIVE_UP.format(n=3)) in kinds
    assert ("flag", reconcile.DONE_NO_LINK) in kinds and ("flag", reconcile.LINK_NOT_DONE) in kinds
    logged = [a.audit_entry(T0) for a in plan.actions]
    again = _plan(s, {run: "failed"}, [redrive] * 3 + logged)
    assert not again.of("flag"), "flags are not repeated"


def test_reconcile_marks_the_later_of_two_claims_of_one_url() -> None:
    s = snap(
        ["https://a.example/1", "PROCESSING #20260105T110000Z-bb"],
        ["https://a.example/1", "PROCESSING #20260105T100000Z-aa"],
    )
    plan = _plan(s, {})
    dup = plan.of("transition")
    assert [a.row.token for a in dup] == ["20260105T110000Z-bb"]
    assert dup[0].new_status is Status.DUPLICATE


def test_backoff_honours_retry_after_and_jitters_below_the_cap() -> None:
    slept: list[float] = []
    backoff = Backoff(base=0.1, cap=0.4, attempts=4, sleep=slept.append)
    calls = iter([QuotaExceeded("429", 2.0), QuotaExceeded("429", None), QuotaExceeded("429", None)])

    def flaky() -> str:
        err = next(calls, None)
        if err:
            raise err
        return "ok"

    assert backoff.call(flaky) == "ok"
    assert slept[0] >= 2.0 and all(0 <= s <= 0.4 for s in slept[1:])
    with pytest.raises(QuotaExceeded):
        Backoff(attempts=2, sleep=slept.append).call(lambda: (_ for _ in ()).throw(QuotaExceeded("429")))


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    from email.utils import format_datetime

    from onceflow.sheets.transport import _retry_after

    assert _retry_after({"retry-after": "3"}) == 3.0
    assert _retry_after({}) is None and _retry_after({"retry-after": "soon"}) is None
    later = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert 20 < (_retry_after({"retry-after": format_datetime(later, usegmt=True)}) or 0) <= 30


def test_reconcile_recomputes_reasons_and_run_ids_that_do_not_belong_to_their_row() -> None:
    key1 = row_key(normalise_url("https://a.example/1"))
    key2 = row_key(normalise_url("https://a.example/2"))
    s = snap(
        [
            "https://a.example/1",
            "DONE #20260105T100000Z-aa",
            "",
            pipeline_run_id(key1, "v1"),
            "",
            "https://p/1",
        ],
        [
            "https://a.example/2",
            "DONE #20260105T100000Z-bb",
            "",
            pipeline_run_id(key1, "v1"),
            "",
            "https://p/2",
        ],
        ["", "INVALID #20260105T100000Z-cc", ""],
        ["https://a.example/1", "DUPLICATE #20260105T100000Z-dd", ""],
        ["https://a.example/1", "DUPLICATE #20260105T100000Z-ee", "duplicate of row 2 (https://a.example/1)"],
    )
    rewrites = {a.row.token: dict(a.fields) for a in _plan(s, {}).of("rewrite")}
    assert rewrites == {
        "20260105T100000Z-bb": {"run_id": pipeline_run_id(key2, "v1")},
        "20260105T100000Z-cc": {"reason": "empty URL"},
        "20260105T100000Z-dd": {"reason": "duplicate of row 2 (https://a.example/1)"},
    }


@pytest.mark.parametrize("owner", ["REJECTED", "DONE", "FAILED", "NEEDS_REVIEW"])
def test_a_row_that_went_past_processing_owns_its_url_against_a_claim_of_the_same_second(owner: str) -> None:
    """The fault schedules found it (seed 468 of 200-1199): a NEW row repeating a REJECTED row's
    URL, claimed within the same second as that row's own claim, sorted its random token part
    before the owner's, kept the URL, and the rejected article was published. Only claims still
    PROCESSING race by claim time."""
    when = datetime(2026, 12, 3, 9, 38, 3, tzinfo=timezone.utc)
    old, mine = new_token(when, "b506ea0ad2", "v1"), new_token(when, "a6a94575df", "v1")
    assert mine < old, "the later claim's token sorts first: same second, smaller random part"
    s = snap(["https://a.example/x", f"{owner} #{old}"], ["https://a.example/x", f"PROCESSING #{mine}"])
    (verdict,) = classify_claimed(s, {mine: s.rows[1]}).values()
    assert verdict.status is Status.DUPLICATE and verdict.reason == "duplicate of row 2 (https://a.example/x)"
    # two claims still PROCESSING race by token: the earlier-sorting one keeps the URL
    racing = snap(
        ["https://a.example/x", f"PROCESSING #{old}"], ["https://a.example/x", f"PROCESSING #{mine}"]
    )
    assert classify_claimed(racing, {mine: racing.rows[1]})[mine].ok
