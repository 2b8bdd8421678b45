"""The finance dashboard: the last 30 loaded days of sales as an HTML page with a PNG chart.

:func:`render_dashboard` is a pure function (rows in, HTML and PNG bytes out): no clock, no
randomness, so the same rows always give byte-identical files. :func:`fetch_dashboard_rows`
reads the rows from the warehouse (``load_audit`` joined with per-day sums of the sales table, in
one statement so that both come from one snapshot) and
:func:`write_dashboard` publishes the files so that a reader never sees a page without its chart.

A day is *complete* when its partition has a ``load_audit`` row: the overwrite is atomic and runs
only after the day's data interval ended. A day of the window without one is drawn as
"not loaded", never as zero sales: absence is not evidence.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.files import atomic_write_bytes
from onceflow.sales.partitions import partition_key, validate_partition
from onceflow.sales.schema import sales_table, warehouse_tables
from onceflow.sales.table_names import resolve_table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.engine import Connection

WINDOW_DAYS = 30
HTML_NAME = "index.html"
CHART_PREFIX = "sales-chart-"


@dataclass(frozen=True)
class DayRow:
    """One loaded partition: its ``load_audit`` row and the sums of its sales rows.

    :param day: the business-local day (the partition).
    :param net_cents: sum of net amounts, in the warehouse currency's cents.
    :param refund_cents: sum of refunded amounts, in cents.
    :param orders: number of order rows in the partition.
    :param rejects: rows of the source day rejected into ``rejects``.
    :param loaded_at_utc: when the partition was committed (naive UTC, as stored).
    :param run_id: the Airflow run that committed it.
    """

    day: dt.date
    net_cents: int
    refund_cents: int
    orders: int
    rejects: int
    loaded_at_utc: dt.datetime
    run_id: str


@dataclass(frozen=True)
class RenderedDashboard:
    """The dashboard files. ``png`` is None when there is nothing to chart."""

    html: str
    png: bytes | None
    chart_name: str | None
    newest_complete_day: dt.date | None
    missing_days: tuple[dt.date, ...]


def fetch_dashboard_rows(conn: Connection, *, table: str, window_days: int = WINDOW_DAYS) -> list[DayRow]:
    """The loaded partitions of the newest ``window_days`` days of ``table``, oldest first.

    The window ends at the newest partition in ``load_audit``; days without an audit row are
    simply absent from the result (the renderer shows them as not loaded). A warehouse whose
    tables do not exist yet gives no rows.

    :param conn: a connection to the warehouse.
    :param table: the sales table (validated as an identifier).
    :param window_days: how many calendar days the window spans.
    """
    md = sa.MetaData()
    resolved = resolve_table(conn.engine, table)  # the name the loads fenced and audited it under
    table = resolved.fence_name
    sales = sales_table(resolved.statement_name, md)
    audit = warehouse_tables(md).audit
    inspector = sa.inspect(conn)
    if not inspector.has_table(audit.name) or not inspector.has_table(sales.name, schema=sales.schema):
        return []  # nothing was ever loaded into this warehouse
    newest_key = conn.execute(
        sa.select(sa.func.max(audit.c.partition_key)).where(audit.c.table_name == table)
    ).scalar_one_or_none()
    if newest_key is None:
        return []
    newest = validate_partition(newest_key)
    oldest = newest - dt.timedelta(days=window_days - 1)
    # One statement, so one snapshot: a load committing meanwhile is either wholly in (its audit
    # row and its sums) or wholly out. (The newest key above only places the window.)
    sums = (
        sa.select(
            sales.c.partition_date.label("day"),
            sa.func.coalesce(sa.func.sum(sales.c.net_cents), 0).label("net_cents"),
            sa.func.coalesce(sa.func.sum(sales.c.refund_cents), 0).label("refund_cents"),
            sa.func.count().label("orders"),
        )
        .where(sales.c.partition_date.between(oldest, newest))
        .group_by(sales.c.partition_date)
        .subquery("sums")
    )
    # SQLite stores dates as ISO text, the same text as the key; PostgreSQL compares dates.
    key_day = (
        sa.cast(audit.c.partition_key, sa.Date)
        if conn.dialect.name == "postgresql"
        else audit.c.partition_key
    )
    audit_rows = conn.execute(
        sa.select(
            audit.c.partition_key,
            audit.c.reject_count,
            audit.c.loaded_at_utc,
            audit.c.run_id,
            sums.c.net_cents,
            sums.c.refund_cents,
            sums.c.orders,
        )
        .select_from(audit.outerjoin(sums, sums.c.day == key_day))
        .where(audit.c.table_name == table)
        .where(audit.c.partition_key.between(partition_key(oldest), partition_key(newest)))
        .order_by(audit.c.partition_key)
    ).all()
    rows = []
    for a in audit_rows:
        rows.append(
            DayRow(
                day=validate_partition(a.partition_key),
                net_cents=int(a.net_cents or 0),
                refund_cents=int(a.refund_cents or 0),
                orders=int(a.orders or 0),
                rejects=int(a.reject_count),
                loaded_at_utc=a.loaded_at_utc,
                run_id=a.run_id,
            )
        )
    return rows


def render_dashboard(
    rows: Sequence[DayRow],
    *,
    title: str = "Daily sales",
    currency: str = "EUR",
    window_days: int = WINDOW_DAYS,
) -> RenderedDashboard:
    """Render the page and chart for ``rows`` (loaded partitions, any order).

    The window is the ``window_days`` calendar days ending at the newest row's day; rows before
    it are ignored. With no rows the page says clearly that no data has been loaded.

    :param rows: the loaded partitions, e.g. from :func:`fetch_dashboard_rows`.
    :param title: the page heading.
    :param currency: the warehouse currency, for labels.
    :param window_days: the number of calendar days shown.
    """
    if not rows:
        return RenderedDashboard(
            html=_page(title, _NO_DATA_BODY, freshness="No complete day yet: nothing has been loaded."),
            png=None,
            chart_name=None,
            newest_complete_day=None,
            missing_days=(),
        )
    newest = max(r.day for r in rows)
    days = [newest - dt.timedelta(days=n) for n in range(window_days - 1, -1, -1)]
    by_day = {r.day: r for r in rows if r.day >= days[0]}
    missing = tuple(d for d in days if d not in by_day)
    newest_row = by_day[newest]
    freshness = (
        f"Complete through {newest:%A %d %B %Y}, loaded {newest_row.loaded_at_utc:%Y-%m-%d %H:%M} UTC "
        f"by run {newest_row.run_id}."
    )
    png = _chart_png(
        days, by_day, title=title, currency=currency, freshness=f"Complete through {newest:%a %d %b %Y}"
    )
    chart_name = f"{CHART_PREFIX}{hashlib.sha256(png).hexdigest()[:16]}.png"
    body = _body(days, by_day, missing, chart_name=chart_name, currency=currency)
    return RenderedDashboard(
        html=_page(title, body, freshness=freshness),
        png=png,
        chart_name=chart_name,
        newest_complete_day=newest,
        missing_days=missing,
    )


def write_dashboard(rendered: RenderedDashboard, out_dir: Path) -> Path:
    """Publish the dashboard into ``out_dir`` and return the page's path.

    The chart's name is its content hash and it is written before the page, each file by an
    atomic rename, so a reader always gets a page whose chart exists. Older charts are removed
    afterwards.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if rendered.png is not None and rendered.chart_name is not None:
        atomic_write_bytes(out_dir / rendered.chart_name, rendered.png)
    page = out_dir / HTML_NAME
    atomic_write_bytes(page, rendered.html.encode("utf-8"))
    for old in out_dir.glob(f"{CHART_PREFIX}*.png"):
        if old.name != rendered.chart_name:
            old.unlink(missing_ok=True)
    return page


def _money(cents: int, currency: str) -> str:
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{frac:02d} {currency}"


def _chart_png(
    days: Sequence[dt.date],
    by_day: dict[dt.date, DayRow],
    *,
    title: str,
    currency: str,
    freshness: str,
) -> bytes:
    # Imported here: matplotlib is heavy and must never load when a DAG file is parsed. The
    # object API with an explicit Agg canvas needs no global backend switch and no pyplot state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(days)))
    loaded = [i for i, d in enumerate(days) if d in by_day]
    values = [by_day[days[i]].net_cents / 100 for i in loaded]
    ax.bar(loaded, values, color="#2f6f9f", width=0.8, label=f"net sales ({currency})")
    top = max([*values, 0.0])
    gaps = [i for i, d in enumerate(days) if d not in by_day]
    if gaps:
        height = top if top > 0 else 1.0
        ax.bar(
            gaps,
            [height] * len(gaps),
            color="none",
            edgecolor="#c0392b",
            hatch="///",
            width=0.8,
            label="not loaded",
        )
    ax.set_title(f"{title}: last {len(days)} days\n{freshness}", fontsize=11, loc="left")
    ax.set_ylabel(f"net sales ({currency})")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    # Tick every third day counting back from the newest, so the newest day is always labelled.
    ticks = xs[::-3][::-1] if len(days) > 14 else xs
    ax.set_xticks(ticks, [f"{days[i]:%a %d %b}" for i in ticks], rotation=45, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(days) - 0.4)
    # Headroom for the legend; room below zero for a day whose refunds exceed its sales.
    ax.set_ylim(min([*values, 0.0]) * 1.2, (top if top > 0 else 1.0) * 1.2)
    ax.grid(axis="y", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    # No "Software" text chunk: the bytes depend only on the rows (and the renderer).
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _body(
    days: Sequence[dt.date],
    by_day: dict[dt.date, DayRow],
    missing: Sequence[dt.date],
    *,
    chart_name: str,
    currency: str,
) -> str:
    esc = html.escape
    parts = [f'<img src="{esc(chart_name)}" alt="Net sales per day, last {len(days)} days">']
    if missing:
        listed = ", ".join(f"{d:%a %d %b}" for d in missing)
        parts.append(
            f'<p class="warn">Not loaded ({len(missing)} day{"s" if len(missing) != 1 else ""} '
            f"of the window): {esc(listed)}. These days are missing, not zero.</p>"
        )
    total = sum(r.net_cents for r in by_day.values())
    parts.append(
        f"<p>Net sales over the loaded days of the window: <b>{esc(_money(total, currency))}</b></p>"
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("Day", "Net sales", "Refunds", "Orders", "Rejected rows", "Loaded (UTC)", "Run")
    )
    body_rows = []
    for d in reversed(days):
        r = by_day.get(d)
        if r is None:
            body_rows.append(
                f'<tr class="missing"><td>{d:%a %Y-%m-%d}</td><td colspan="6">not loaded</td></tr>'
            )
            continue
        body_rows.append(
            "<tr>"
            f"<td>{d:%a %Y-%m-%d}</td>"
            f'<td class="num">{esc(_money(r.net_cents, currency))}</td>'
            f'<td class="num">{esc(_money(r.refund_cents, currency))}</td>'
            f'<td class="num">{r.orders:,}</td>'
            f'<td class="num{" warn" if r.rejects else ""}">{r.rejects:,}</td>'
            f"<td>{r.loaded_at_utc:%Y-%m-%d %H:%M}</td>"
            f"<td><code>{esc(r.run_id)}</code></td>"
            "</tr>"
        )
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body_rows)}</tbody></table>")
    return "\n".join(parts)


_NO_DATA_BODY = (
    '<p class="warn"><b>No data.</b> No partition of the sales table has been loaded yet '
    "(<code>load_audit</code> has no rows), so there is nothing to chart. This is not a day of "
    "zero sales.</p>"
)

_STYLE = (
    "body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:2em;color:#222}"
    ".fresh{font-size:1.1em;padding:.5em .8em;background:#eef5fb;border-left:4px solid #2f6f9f}"
    ".warn{color:#c0392b}table{border-collapse:collapse;margin-top:1em;font-size:.9em}"
    "th,td{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}"
    "td.num{text-align:right}tr.missing td{color:#c0392b;font-style:italic}img{max-width:100%}"
)


def _page(title: str, body: str, *, freshness: str) -> str:
    esc = html.escape
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n"
        f'<p class="fresh" id="freshness">{esc(freshness)}</p>\n'
        f"{body}\n</body>\n</html>\n"
    )
