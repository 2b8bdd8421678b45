"""Small inline SVG charts, drawn on the server: nothing to download, nothing to run in the browser.

Every value that reaches the markup is a number we format or text escaped by ``markupsafe``.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

W, H = 320, 90


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def bars(
    values: Sequence[float],
    labels: Sequence[str],
    *,
    title: str,
    mean: float | None = None,
    second: Sequence[float] | None = None,
    width: int = W,
    height: int = H,
) -> Markup:
    """Vertical bars (``second``: a thinner second series beside each bar), an optional mean line.

    :param labels: one tooltip label per bar.
    """
    top = max([*values, *(second or []), mean or 0, 1])
    n = max(len(values), 1)
    step = width / n
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height + 14}" width="{width}" height="{height + 14}">'
        f"<title>{escape(title)}</title>"
    ]
    for i, v in enumerate(values):
        h = height * v / top
        bar_w = max(step * (0.45 if second is not None else 0.8), 1)
        parts.append(
            f'<rect class="bar" x="{i * step:.1f}" y="{height - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}">'
            f"<title>{escape(labels[i])}: {_fmt(v)}</title></rect>"
        )
        if second is not None:
            h2 = height * second[i] / top
            parts.append(
                f'<rect class="bar2" x="{i * step + bar_w:.1f}" y="{height - h2:.1f}" width="{bar_w:.1f}" '
                f'height="{h2:.1f}"><title>{escape(labels[i])}: {_fmt(second[i])}</title></rect>'
            )
    if mean is not None:
        y = height - height * mean / top
        parts.append(
            f'<line class="mean" x1="0" x2="{width}" y1="{y:.1f}" y2="{y:.1f}"><title>trailing mean {_fmt(mean)}</title></line>'
        )
    parts.append(f'<line class="axis" x1="0" x2="{width}" y1="{height}" y2="{height}"></line>')
    parts.append(f'<text x="0" y="{height + 12}">{escape(labels[0]) if labels else ""}</text>')
    if len(labels) > 1:
        parts.append(f'<text x="{width}" y="{height + 12}" text-anchor="end">{escape(labels[-1])}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
