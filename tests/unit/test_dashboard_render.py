"""The finance dashboard renderer: rows in, HTML and PNG out, nothing else."""

from __future__ import annotations

import datetime as dt
import random
from typing import TYPE_CHECKING

from onceflow.sales.dashboard import DayRow, render_dashboard, write_dashboard

if TYPE_CHECKING:
    from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def day_row(day: dt.date, net_cents: int = 1_000_000, **overrides: object) -> DayRow:
    values: dict[str, object] = {
        "day": day,
        "net_cents": net_cents,
        "refund_cents": 12_300,
        "orders": 321,
        "rejects": 0,
        "loaded_at_utc": dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0, 7)),
        "run_id": f"scheduled__{day}T23:00:00+00:00",
    }
    values.update(overrides)
    return DayRow(**values)  # type: ignore[arg-type]


def month(last: dt.date, days: int = 40) -> list[DayRow]:
    return [
        day_row(last - dt.timedelta(days=n), net_cents=900_000 + (n * 7_919) % 350_000) for n in range(days)
    ]


def test_the_same_rows_render_byte_identical_files_in_any_order() -> None:
    rows = month(dt.date(2026, 11, 28))
    shuffled = rows[:]
    random.Random(4).shuffle(shuffled)

    first, second = render_dashboard(rows), render_dashboard(shuffled)

    assert first.png is not None and first.png.startswith(PNG_MAGIC)
    assert first.png == second.png
    assert first.html == second.html
    assert first.chart_name == second.chart_name


def test_different_rows_render_a_different_chart() -> None:
    rows = month(dt.date(2026, 11, 28))
    changed = [*rows[1:], day_row(rows[0].day, net_cents=rows[0].net_cents + 100_00)]

    assert render_dashboard(rows).chart_name != render_dashboard(changed).chart_name


def test_the_freshness_line_names_the_newest_complete_day() -> None:
    rows = month(dt.date(2026, 11, 28))

    rendered = render_dashboard(rows)

    assert rendered.newest_complete_day == dt.date(2026, 11, 28)
    assert (
        '<p class="fresh" id="freshness">Complete through Saturday 28 November 2026, loaded '
        "2026-11-29 00:07 UTC by run scheduled__2026-11-28T23:00:00+00:00.</p>"
    ) in rendered.html


def test_the_newest_complete_day_is_the_newest_loaded_one_even_after_a_gap() -> None:
    newest = dt.date(2026, 11, 28)
    rows = [r for r in month(newest) if r.day not in (dt.date(2026, 11, 26), dt.date(2026, 11, 27))]

    rendered = render_dashboard(rows)

    assert rendered.newest_complete_day == newest
    assert rendered.missing_days == (dt.date(2026, 11, 26), dt.date(2026, 11, 27))
    assert "Not loaded (2 days of the window): Thu 26 Nov, Fri 27 Nov. These days are missing, not zero." in (
        rendered.html
    )
    assert rendered.html.count('<tr class="missing">') == 2


def test_the_window_is_thirty_days_ending_at_the_newest_day() -> None:
    rows = month(dt.date(2026, 11, 28), days=45)

    rendered = render_dashboard(rows)

    assert "Sun 2026-10-30" not in rendered.html  # 30 days back from 28 Nov is 30 Oct, a Friday
    assert "Fri 2026-10-30" in rendered.html
    assert "Thu 2026-10-29" not in rendered.html
    assert rendered.html.split("<tbody>")[1].count("<tr>") == 30


def test_a_loaded_day_with_no_sales_is_zero_not_missing() -> None:
    newest = dt.date(2026, 11, 28)
    rows = [*month(newest)[1:], day_row(newest, net_cents=0, refund_cents=0, orders=0)]

    rendered = render_dashboard(rows)

    assert rendered.missing_days == ()
    assert '<td>Sat 2026-11-28</td><td class="num">0.00 EUR</td>' in rendered.html


def test_an_empty_table_renders_a_clear_no_data_page() -> None:
    rendered = render_dashboard([])

    assert rendered.png is None and rendered.chart_name is None
    assert rendered.newest_complete_day is None
    assert "<b>No data.</b>" in rendered.html
    assert "No complete day yet: nothing has been loaded." in rendered.html
    assert "<img" not in rendered.html


def test_text_from_the_database_is_escaped() -> None:
    newest = dt.date(2026, 11, 28)
    rows = [day_row(newest, run_id="manual__<script>alert(1)</script>")]

    rendered = render_dashboard(rows)

    assert "<script>" not in rendered.html
    assert "&lt;script&gt;" in rendered.html


def test_negative_days_and_refunds_are_shown_with_their_sign() -> None:
    newest = dt.date(2026, 11, 28)

    rendered = render_dashboard([day_row(newest, net_cents=-123_456)])

    assert "-1,234.56 EUR" in rendered.html
    assert rendered.png is not None


def test_writing_publishes_the_chart_the_page_names_and_drops_older_charts(tmp_path: Path) -> None:
    older = render_dashboard(month(dt.date(2026, 11, 27)))
    newer = render_dashboard(month(dt.date(2026, 11, 28)))
    assert older.chart_name != newer.chart_name

    write_dashboard(older, tmp_path)
    page = write_dashboard(newer, tmp_path)

    assert page == tmp_path / "index.html"
    assert page.read_text(encoding="utf-8") == newer.html
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index.html", str(newer.chart_name)])
    assert (tmp_path / str(newer.chart_name)).read_bytes() == newer.png


def test_writing_the_no_data_page_removes_a_stale_chart(tmp_path: Path) -> None:
    write_dashboard(render_dashboard(month(dt.date(2026, 11, 28))), tmp_path)

    write_dashboard(render_dashboard([]), tmp_path)

    assert [p.name for p in tmp_path.iterdir()] == ["index.html"]
