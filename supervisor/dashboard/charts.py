"""Server-side SVG charts for the overview (request threads): no script, no vendored chart
library, so the page works on an air-gapped VM and with scripts off.  The SVG stretches to
the page's width (``preserveAspectRatio="none"``), so its labels are HTML around it and its
strokes do not scale.  Axes: the y scale's top, middle and 0 on the left; along x the
times (-60 min, -30 min, now) with their clock times (UTC)."""

from __future__ import annotations

import time

from markupsafe import Markup, escape

from .history import DEPTH_STATES, Sample

W, H = 600, 150


def _clock(when: float) -> str:
    return time.strftime("%H:%M", time.gmtime(when))


def _frame(body: str, label: str, now: float, window: float, top: int,
           empty: str | None) -> Markup:
    mins = int(window // 60)
    blank = f'<p class="chart-empty">{escape(empty)}</p>' if empty else ""
    ticks = "".join(
        f'<span>{f"-{m} min" if m else "now"} <time>{_clock(now - 60 * m)}'
        f'{"" if m else " UTC"}</time></span>' for m in (mins, mins // 2, 0))
    mid = H - (H - 4) / 2  # where top / 2 is drawn
    return Markup(
        f'<div class="chart"><div class="chart-plot"><div class="chart-y">'
        f'<span class="chart-top">{top}</span><span class="chart-mid">{top / 2:g}</span>'
        f'<span>0</span></div>'
        f'<svg viewBox="0 0 {W} {H}" preserveAspectRatio="none" role="img" '
        f'aria-label="{escape(label)}"><line x1="0" y1="{H}" x2="{W}" y2="{H}" '
        f'class="axis"/><line x1="0" y1="{mid:g}" x2="{W}" y2="{mid:g}" class="grid"/>'
        f'{body}</svg>{blank}</div>'
        f'<div class="chart-x">{ticks}</div></div>')


def _x(when: float, now: float, window: float) -> float:
    return W * max(0.0, 1.0 - (now - when) / window)


def depth_series(samples: list[Sample]) -> list[str]:
    """The counts the samples hold, in the backend's words (the chart's lines and legend)."""
    seen = {k for s in samples for k in s.depth}
    return [k for k in DEPTH_STATES if k in seen]


def depth_chart(samples: list[Sample], now: float, window: float) -> Markup:
    """Each count the backend reports (depth_series) over the window, as a polyline with the
    latest value as a dot (a fresh dashboard's few samples sit in one pixel column)."""
    series = depth_series(samples)
    top = max([1] + [v for s in samples for v in s.depth.values()])

    def line(values: list[tuple[float, int]], cls: str) -> str:
        xy = [(_x(t, now, window), H - (H - 4) * v / top) for t, v in values]
        if not xy:
            return ""
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        x, y = xy[-1]
        return (f'<polyline class="{cls}" points="{pts}"/>'
                f'<line class="dot {cls}" x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" '
                f'y2="{y:.1f}"/>')

    body = "".join(line([(s.when, s.depth[k]) for s in samples if k in s.depth], k)
                   for k in series)
    return _frame(body, "queue depth over the last hour", now, window, top,
                  None if samples else "no samples yet")


def finished_chart(buckets: list[tuple[float, int, int]], now: float, window: float
                   ) -> Markup:
    """Tasks finished per minute: succeeded and failed, stacked bars."""
    top = max([1] + [s + f for _, s, f in buckets])
    bar = W * 60 / window
    scale = (H - 4) / top
    body = ""
    for minute, ok, bad in buckets:
        x = min(_x(minute, now, window), W - bar)
        y_ok = H - ok * scale
        body += (f'<rect class="succeeded" x="{x:.1f}" y="{y_ok:.1f}" width="{bar:.1f}" '
                 f'height="{ok * scale:.1f}"><title>{ok} succeeded</title></rect>'
                 f'<rect class="failed" x="{x:.1f}" y="{y_ok - bad * scale:.1f}" '
                 f'width="{bar:.1f}" height="{bad * scale:.1f}"><title>{bad} failed</title>'
                 f'</rect>')
    return _frame(body, "tasks finished per minute", now, window, top,
                  None if buckets else "no data yet")
