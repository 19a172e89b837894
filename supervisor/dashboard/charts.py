"""Server-side SVG charts for the overview (request threads): no script, no vendored chart
library, so the page works on an air-gapped VM and with scripts off."""

from __future__ import annotations

from markupsafe import Markup, escape

from .history import Sample

W, H, PAD = 600, 160, 24


def _frame(body: str, label: str, now: float, window: float, top: int) -> Markup:
    mins = int(window // 60)
    return Markup(
        f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="{escape(label)}" >'
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W}" y2="{H - PAD}" class="axis"/>'
        f'<text x="2" y="12" class="tick">{top}</text>'
        f'<text x="2" y="{H - PAD}" class="tick">0</text>'
        f'<text x="{PAD}" y="{H - 6}" class="tick">-{mins} min</text>'
        f'<text x="{W - 30}" y="{H - 6}" class="tick">now</text>{body}</svg>')


def _x(when: float, now: float, window: float) -> float:
    return PAD + (W - PAD) * max(0.0, 1.0 - (now - when) / window)


def depth_chart(samples: list[Sample], now: float, window: float) -> Markup:
    """Pending and running over the window, as two polylines."""
    top = max([1] + [max(s.pending, s.running) for s in samples])

    def line(values: list[tuple[float, int]], cls: str) -> str:
        pts = " ".join(f"{_x(t, now, window):.1f},{H - PAD - (H - 2 * PAD) * v / top:.1f}"
                       for t, v in values)
        return f'<polyline class="{cls}" points="{pts}"/>' if values else ""

    body = (line([(s.when, s.pending) for s in samples], "pending")
            + line([(s.when, s.running) for s in samples], "running"))
    if not samples:
        body += f'<text x="{W // 2 - 60}" y="{H // 2}" class="tick">no samples yet</text>'
    return _frame(body, "queue depth over the last hour", now, window, top)


def finished_chart(buckets: list[tuple[float, int, int]], now: float, window: float
                   ) -> Markup:
    """Tasks finished per minute: succeeded and failed, stacked bars."""
    top = max([1] + [s + f for _, s, f in buckets])
    bar = (W - PAD) * 60 / window - 1
    body = ""
    for minute, ok, bad in buckets:
        x = _x(minute, now, window)
        scale = (H - 2 * PAD) / top
        y_ok = H - PAD - ok * scale
        body += (f'<rect class="succeeded" x="{x:.1f}" y="{y_ok:.1f}" width="{bar:.1f}" '
                 f'height="{ok * scale:.1f}"><title>{ok} succeeded</title></rect>'
                 f'<rect class="failed" x="{x:.1f}" y="{y_ok - bad * scale:.1f}" '
                 f'width="{bar:.1f}" height="{bad * scale:.1f}"><title>{bad} failed</title>'
                 f'</rect>')
    if not buckets:
        body += f'<text x="{W // 2 - 60}" y="{H // 2}" class="tick">no data yet</text>'
    return _frame(body, "tasks finished per minute", now, window, top)
