"""A read-only HTML view of the emulator's spreadsheets, so a demo sheet opens in a browser.

``GET /`` lists the spreadsheets; ``GET /view/<spreadsheetId>`` shows every tab as a table: the
formatted values, a ``status`` column coloured by its state word (DONE green, FAILED red, ...),
and cells holding an ``http(s)://`` URL as links. Every cell is escaped: sheet editors are not
trusted, and a cell must not become markup or a ``javascript:`` link. The page reloads itself
every few seconds, as a shared sheet updates under its reader. Nothing here writes: there are no
forms, and it counts no API request (quota, request log, faults do not see it).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from onceflow.testing.sheets_emulator.cells import render

if TYPE_CHECKING:
    from onceflow.testing.sheets_emulator.model import Sheet, Spreadsheet, Store

#: Seconds between the page's own reloads.
REFRESH_SECONDS = 5
#: Background colour of a ``status`` cell, by the word it starts with.
STATUS_COLOURS = {
    "NEW": "#dbeafe",
    "CLAIMED": "#e0e7ff",
    "DONE": "#bbf7d0",
    "NEEDS_REVIEW": "#fde68a",
    "REJECTED": "#fed7aa",
    "FAILED": "#fecaca",
    "INVALID": "#e5e7eb",
}
_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#111}"
    "table{border-collapse:collapse;margin-bottom:2rem;font-size:.9rem}"
    "th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top;max-width:32rem;"
    "overflow-wrap:anywhere}th{background:#f3f4f6}td.rownum{color:#888;text-align:right}"
)


def is_view_path(path: str) -> bool:
    """Whether a GET of ``path`` is this view's (the API lives under ``/v4/``, control under ``/_emulator/``)."""
    return path in ("/", "/index.html") or path.startswith("/view/")


def render_path(store: Store, path: str) -> tuple[int, str]:
    """``(status, html)`` for a GET of ``path`` (one of :func:`is_view_path`'s)."""
    with store.lock:
        if path in ("/", "/index.html"):
            return 200, _index(store)
        spreadsheet_id = unquote(path.removeprefix("/view/"))
        book = store.spreadsheets.get(spreadsheet_id)
        if book is None:
            return 404, _page("Not found", f"<p>No spreadsheet {_e(spreadsheet_id)!s}.</p>", refresh=False)
        return 200, _spreadsheet(book)


def _index(store: Store) -> str:
    items = "".join(
        f'<li><a href="/view/{quote(sid, safe="")}">{_e(book.title)}</a> <code>{_e(sid)}</code></li>'
        for sid, book in sorted(store.spreadsheets.items())
    )
    body = f"<ul>{items}</ul>" if items else "<p>No spreadsheets yet.</p>"
    return _page("Sheets emulator", "<h1>Spreadsheets</h1>" + body)


def _spreadsheet(book: Spreadsheet) -> str:
    parts = [f"<p><a href='/'>All spreadsheets</a></p><h1>{_e(book.title)}</h1>"]
    for sheet in book.sheets:
        parts.append(f"<h2>{_e(sheet.title)}</h2>{_table(sheet)}")
    return _page(book.title, "".join(parts))


def _table(sheet: Sheet) -> str:
    values = [[str(render(cell, "FORMATTED_VALUE")) for cell in row] for row in sheet.rows]
    while values and not any(values[-1]):
        values.pop()
    if not values:
        return "<p>(empty)</p>"
    width = max(len(r) for r in values)
    header = values[0] + [""] * (width - len(values[0]))
    status_col = header.index("status") if "status" in header else None
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    rows = []
    for number, row in enumerate(values[1:], start=2):
        row = row + [""] * (width - len(row))
        cells = "".join(_cell(v, is_status=(c == status_col)) for c, v in enumerate(row))
        rows.append(f"<tr><td class='rownum'>{number}</td>{cells}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"


def _cell(value: str, *, is_status: bool) -> str:
    if is_status and value:
        colour = STATUS_COLOURS.get(value.split()[0].upper(), "")
        style = f" style='background:{colour}'" if colour else ""
        return f"<td class='status'{style}>{_e(value)}</td>"
    if value.startswith(("http://", "https://")) and not any(c.isspace() for c in value):
        return f'<td><a href="{_e(value)}" rel="noopener noreferrer">{_e(value)}</a></td>'
    return f"<td>{_e(value)}</td>"


def _page(title: str, body: str, *, refresh: bool = True) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{meta}<title>{_e(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}"
        "<p><small>Read-only view of the onceflow Sheets emulator.</small></p></body></html>"
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)
