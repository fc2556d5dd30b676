"""Line charts drawn on the server, as SVG: no script, no library, nothing
fetched. A chart is plain JSON-ready data (what the API sends), the same
for every page:

    {"id": "backlog", "title": "Backlog per queue", "unit": "tasks",
     "times": ["2024-05-01T12:00:00+00:00", ...],          # bucket starts
     "series": [{"name": "reports", "values": [12, None, ...]}, ...]}

and `svg` turns it into a <figure>: axes, time labels, one <path> per
series carrying `data-series="<name>"`, and a legend. Colours are CSS
classes (s0..s7, other, dash) that the console's stylesheet sets for light
and dark schemes: no inline style, which the console's CSP forbids. Names
are user input (tenants, queues): every one is escaped."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 12, 26
COLOURS = 8  # s0..s7, then they repeat
TIME_LABELS = 6
Y_TICKS = 4


# Durations a seconds axis tops out at: each a quarter of one it can tick.
NICE_SECONDS = [1.0, 2.0, 4.0, 10.0, 20.0, 40.0, 60.0, 120.0, 240.0, 600.0, 1200.0, 2400.0]
NICE_SECONDS += [3600.0 * h for h in (1, 2, 4, 8, 12, 24, 48, 96, 192)]


def nice_top(value: float, unit: str) -> float:
    """The axis's top: a duration whose quarters read well for seconds, a
    nice number otherwise."""
    if unit == "seconds":
        return next((top for top in NICE_SECONDS if value <= top), nice_ceiling(value))
    return nice_ceiling(value)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= value
    (1 for nothing above zero)."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def number(value: float, unit: str = "") -> str:
    """A tick's label: compact counts (1.5k, 2M), or a duration for seconds
    (under a second in ms)."""
    if unit == "seconds":
        for size, suffix in ((86_400.0, "d"), (3_600.0, "h"), (60.0, "m")):
            if value >= size:
                return f"{value / size:.3g}{suffix}"
        if 0 < value < 1:
            return f"{value * 1000:.3g}ms"
        return f"{value:.3g}s"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


# Dash patterns (SVG attributes, not styles) that tell apart series drawn
# on top of one another.
DASHES = ("7 4", "2 4", "10 3 2 3", "4 2")

# Minutes between time labels: the smallest that leaves at most TIME_LABELS.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)


def time_ticks(times: Sequence[str]) -> list[int]:
    """Indexes of the buckets labelled on the time axis: those starting at a
    round step (a whole number of minutes from midnight UTC), at most
    TIME_LABELS of them."""
    minutes: list[int | None] = []
    for time in times:
        try:
            at = datetime.fromisoformat(time)
        except ValueError:
            minutes.append(None)
            continue
        minutes.append(int(at.timestamp() // 60))
    known = [m for m in minutes if m is not None]
    if not known:
        return []
    span = max(known) - min(known)
    step = next((s for s in TIME_STEPS if span // s < TIME_LABELS), TIME_STEPS[-1])
    return [i for i, m in enumerate(minutes) if m is not None and m % step == 0]


def coinciding(series: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """A dash pattern for each series that another drawn before it covers
    everywhere both have values (None: drawn solid, or as it asks)."""
    dashes: list[str | None] = []
    used = 0
    for index, one in enumerate(series):
        mine = [_finite(v) for v in one.get("values") or []]
        covered = any(
            _same(mine, [_finite(v) for v in other.get("values") or []]) for other in series[:index]
        )
        if covered:
            dashes.append(DASHES[used % len(DASHES)])
            used += 1
        else:
            dashes.append(None)
    return dashes


def overlaps(series: Sequence[Mapping[str, Any]], dashed: Sequence[bool]) -> str:
    """The legend's note on dashed lines drawn over solid ones they meet:
    which lies on which where their values are equal (above zero)."""
    met: list[str] = []
    for one, over in zip(series, dashed, strict=True):
        if not over:
            continue
        mine = [_finite(v) for v in one.get("values") or []]
        under = [
            str(other.get("name", ""))
            for other, below in zip(series, dashed, strict=True)
            if not below and _meets(mine, [_finite(v) for v in other.get("values") or []])
        ]
        if under:
            met.append(f"{one.get('name', '')} lies on {' and '.join(under)} where they are equal")
    if not met:
        return ""
    return "Dashed lines are drawn over solid ones: " + "; ".join(met) + "."


def _meets(a: Sequence[float | None], b: Sequence[float | None]) -> bool:
    return any(
        x is not None and y is not None and x > 0 and abs(x - y) <= 1e-9 * max(1.0, abs(x))
        for x, y in zip(a, b, strict=False)
    )


def _same(a: Sequence[float | None], b: Sequence[float | None]) -> bool:
    both = [(x, y) for x, y in zip(a, b, strict=False) if x is not None and y is not None]
    return bool(both) and all(abs(x - y) <= 1e-9 * max(1.0, abs(x)) for x, y in both)


def colour_class(index: int, name: str) -> str:
    return "other" if name == "other" else f"s{index % COLOURS}"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def path_data(values: Sequence[Any], xs: Sequence[float], y_of: Any) -> str:
    """An SVG path through the values; a gap (None) lifts the pen, and a
    point alone draws a dot (round caps on a zero-length line)."""
    parts: list[str] = []
    pen_down = False
    for x, raw in zip(xs, values, strict=False):
        value = _finite(raw)
        if value is None:
            pen_down = False
            continue
        y = y_of(value)
        if pen_down:
            parts.append(f"L{x:.1f},{y:.1f}")
        else:
            parts.append(f"M{x:.1f},{y:.1f}h0")
            pen_down = True
    return " ".join(parts)


def svg(chart: Mapping[str, Any]) -> Markup:
    """The chart as a <figure> holding its <svg> and legend."""
    times: Sequence[str] = chart.get("times") or []
    series: Sequence[Mapping[str, Any]] = chart.get("series") or []
    unit = str(chart.get("unit", ""))
    key = escape(chart.get("id", "chart"))
    title = escape(chart.get("title", ""))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    found = [v for s in series for v in map(_finite, s.get("values") or []) if v is not None]
    top = nice_top(max(found, default=0.0), unit)
    count = len(times)
    xs = [LEFT + (plot_w * i / (count - 1) if count > 1 else plot_w / 2) for i in range(count)]

    def y_of(value: float) -> float:
        return TOP + plot_h * (1 - max(0.0, min(value, top)) / top)

    caption = f' <span class="muted">({escape(unit)})</span>' if unit else ""
    out = [
        f'<figure class="chart" id="chart-{key}"><figcaption>{title}{caption}</figcaption>',
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{title}" '
        f'data-chart="{key}" xmlns="http://www.w3.org/2000/svg"><title>{title}</title>',
        '<g class="gridlines">',
    ]
    for i in range(Y_TICKS + 1):
        value = top * i / Y_TICKS
        y = y_of(value)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(number(value, unit))}</text>"
        )
    out.append('</g><g class="axis">')
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}"/>')
    for i in time_ticks(times):
        anchor = "start" if i == 0 and count > 1 else "end" if i == count - 1 else "middle"
        out.append(
            f'<text class="tick" x="{xs[i]:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">'
            f"{escape(_clock(times[i]))}</text>"
        )
    out.append("</g>")
    if not found:
        out.append(
            f'<text class="empty" x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" '
            'text-anchor="middle">no data in this window yet</text>'
        )
    patterns = coinciding(series)
    dashed = [
        bool(one.get("dashed")) or pattern is not None
        for one, pattern in zip(series, patterns, strict=True)
    ]
    # Solid lines first, dashed ones over them: a dashed line that lies on a
    # solid one (a fair share equal to what was served) shows on top of it,
    # narrower, with the solid line's colour at its edges and in its gaps.
    drawn_paths: list[tuple[bool, str]] = []
    legend = []
    for index, (one, pattern) in enumerate(zip(series, patterns, strict=True)):
        name = str(one.get("name", ""))
        values = one.get("values") or []
        cls = colour_class(index, name) + (" dash" if one.get("dashed") else "")
        dash = f' stroke-dasharray="{pattern}"' if pattern else ""
        if "now" in one:  # the figure at the last count, which may be nothing
            now = _finite(one["now"])
            latest = "none" if now is None or now == 0 else number(now, unit)
        else:
            last = next((v for v in map(_finite, reversed(values)) if v is not None), None)
            latest = "" if last is None else number(last, unit)
        drawn_paths.append(
            (
                dashed[index],
                f'<path class="line {cls}" data-series="{escape(name)}"{dash} '
                f'd="{path_data(values, xs, y_of)}">'
                f"<title>{escape(name)} {escape(latest)}</title></path>",
            )
        )
        # Every series' mark is a short stroke in its colour and dash.
        swatch = (
            '<svg class="swatch" viewBox="0 0 18 6" width="18" height="6" aria-hidden="true" '
            'xmlns="http://www.w3.org/2000/svg">'
            f'<line class="{cls}" x1="0" x2="18" y1="3" y2="3"{dash}/></svg>'
        )
        legend.append(
            f'<li data-series="{escape(name)}"'
            f"{f' data-dash={chr(34)}{pattern}{chr(34)}' if pattern else ''}>{swatch}"
            f'{escape(name)} <span class="muted">{escape(latest)}</span></li>'
        )
    out += [markup for over, markup in drawn_paths if not over]
    out += [markup for over, markup in drawn_paths if over]
    out.append("</svg>")
    out.append(f'<ul class="legend">{"".join(legend)}</ul>')
    note = overlaps(series, dashed)
    if note:
        out.append(f'<p class="legend-note">{escape(note)}</p>')
    out.append("</figure>")
    return Markup("".join(out))


def _clock(time: str) -> str:
    """HH:MM of an ISO 8601 time (UTC, as the console's times are)."""
    return time[11:16] if len(time) >= 16 else time
