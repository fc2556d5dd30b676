"""The console's SVG charts (rota.dashboard.charts) and the windows and series
of their data (rota.dashboard.history), without servers."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rota.core import history as core_history
from rota.dashboard import charts, history
from rota.errors import ValidationError

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def chart(series: list[dict[str, Any]], count: int = 4, unit: str = "tasks") -> dict[str, Any]:
    times = [(T0 + timedelta(minutes=i)).isoformat() for i in range(count)]
    return {"id": "backlog", "title": "Backlog", "unit": unit, "times": times, "series": series}


def parsed(markup: str) -> ET.Element:
    """The figure as XML (the SVG is well-formed: a browser's parser and
    an XML parser read it alike)."""
    return ET.fromstring(markup)


def paths(figure: ET.Element) -> dict[str, str]:
    return {p.attrib["data-series"]: p.attrib["d"] for p in figure.iter(SVG + "path")}


def test_each_series_is_a_path_scaled_into_the_plot() -> None:
    figure = parsed(charts.svg(chart([{"name": "a", "values": [0, 50, 100, 75]}])))
    d = paths(figure)["a"]
    points = [tuple(map(float, p.split(","))) for p in re.findall(r"[ML]([\d.]+,[\d.]+)", d)]
    xs, ys = [x for x, _ in points], [y for _, y in points]
    assert xs[0] == charts.LEFT and xs[-1] == charts.WIDTH - charts.RIGHT
    assert xs == sorted(xs)
    bottom, top = charts.HEIGHT - charts.BOTTOM, charts.TOP
    assert ys[0] == bottom and ys[2] == top  # 0 at the axis, 100 (the nice top) at the top
    assert ys[3] == pytest.approx(top + (bottom - top) * 0.25, abs=0.1)
    ticks = [t.text for t in figure.iter(SVG + "text") if t.attrib.get("text-anchor") == "end"]
    assert ticks[:5] == ["0", "25", "50", "75", "100"]


def test_time_labels_fall_at_round_steps() -> None:
    figure = parsed(charts.svg(chart([{"name": "a", "values": [1] * 60}], count=60)))
    labels = [t.text for t in figure.iter(SVG + "text") if t.attrib.get("y") == "212"]
    assert labels == ["12:00", "12:10", "12:20", "12:30", "12:40", "12:50"]
    # A window that starts off the step: labels only where the step falls.
    times = [f"2024-05-01T07:{m:02d}:00+00:00" for m in range(53, 60)]
    times += [f"2024-05-01T08:{m:02d}:00+00:00" for m in range(0, 9)]
    picked = [times[i][11:16] for i in charts.time_ticks(times)]
    assert picked == ["07:55", "08:00", "08:05"]


def test_waits_under_a_second_read_in_milliseconds() -> None:
    assert charts.number(0.037, "seconds") == "37ms"
    assert charts.number(0.25, "seconds") == "250ms"
    assert charts.number(6.21, "seconds") == "6.21s"
    assert charts.number(0.0, "seconds") == "0s"


def test_coinciding_series_get_distinct_dashes() -> None:
    same = [{"name": n, "values": [1, 2, None]} for n in ("a", "b", "c")]
    other = {"name": "d", "values": [5, 2, 3]}
    assert charts.coinciding([*same, other]) == [None, charts.DASHES[0], charts.DASHES[1], None]
    figure = parsed(charts.svg(chart([*same, other])))
    dashes = {
        p.attrib["data-series"]: p.attrib.get("stroke-dasharray") for p in figure.iter(SVG + "path")
    }
    assert dashes == {"a": None, "b": charts.DASHES[0], "c": charts.DASHES[1], "d": None}


def test_the_legend_says_the_figure_now_not_the_last_drawn() -> None:
    series = [
        {"name": "q", "values": [6.21, None], "now": None},
        {"name": "r", "values": [1.0, 2.0], "now": 0.02},
    ]
    figure = parsed(charts.svg(chart(series, unit="seconds")))
    legend = {li.attrib["data-series"]: "".join(li.itertext()) for li in figure.iter("li")}
    assert legend == {"q": "q none", "r": "r 20ms"}


def test_gaps_lift_the_pen_and_a_lone_point_is_a_dot() -> None:
    d = charts.path_data([1, None, 2, 3, None], [0, 10, 20, 30, 40], lambda v: v)
    assert d == "M0.0,1.0h0 M20.0,2.0h0 L30.0,3.0"
    assert charts.path_data([None, None], [0, 1], lambda v: v) == ""
    assert charts.path_data([float("nan"), "7", True], [0, 1, 2], lambda v: v) == ""


def test_an_empty_chart_still_draws_axes_and_every_series() -> None:
    figure = parsed(charts.svg(chart([{"name": "a", "values": []}, {"name": "b", "values": []}])))
    assert paths(figure) == {"a": "", "b": ""}
    assert any(t.text == "no data in this window yet" for t in figure.iter(SVG + "text"))
    assert parsed(charts.svg({"id": "x", "title": "X", "times": [], "series": []})) is not None


def test_names_are_escaped_everywhere() -> None:
    evil = '"><script>alert(1)</script><b x="'
    markup = charts.svg(
        {
            "id": '"><i>',
            "title": "<b>t</b>",
            "unit": "<u>",
            "times": ["<x>", T0.isoformat()],
            "series": [{"name": evil, "values": [1, 2]}],
        }
    )
    assert "<script>" not in markup and "<b>t" not in markup and "<u>" not in markup
    figure = parsed(markup)  # still well-formed
    assert list(paths(figure)) == [evil]
    assert [li.attrib["data-series"] for li in figure.iter("li")] == [evil]


def test_colours_are_classes_not_styles() -> None:
    series: list[dict[str, Any]] = [{"name": f"q{i}", "values": [i]} for i in range(9)]
    series += [{"name": "other", "values": [1]}, {"name": "fair", "values": [1], "dashed": True}]
    markup = charts.svg(chart(series, count=1))
    assert "style=" not in markup
    classes = [p.attrib["class"] for p in parsed(markup).iter(SVG + "path")]
    assert classes[0] == "line s0" and classes[8] == "line s0"  # eight colours, repeated
    assert classes[9] == "line other" and classes[10] == "line s2 dash"


@pytest.mark.parametrize(
    ("value", "ceiling"), [(0, 1), (-3, 1), (0.3, 0.5), (7, 10), (120, 200), (2400, 2500)]
)
def test_nice_ceilings(value: float, ceiling: float) -> None:
    assert charts.nice_ceiling(value) == pytest.approx(ceiling)


def test_a_seconds_axis_tops_out_at_a_round_duration() -> None:
    assert [charts.nice_top(v, "seconds") for v in (0.5, 45, 2100, 5000)] == [1, 60, 2400, 7200]
    assert charts.nice_top(2100, "tasks") == 2500


def test_tick_labels() -> None:
    assert [charts.number(v) for v in (0, 12.5, 1500, 2_000_000)] == ["0", "12.5", "1.5k", "2M"]
    assert [charts.number(v, "seconds") for v in (5, 90, 7200)] == ["5s", "1.5m", "2h"]


def test_windows_are_bounded_to_a_fixed_set_and_points() -> None:
    assert history.window_of(None) == "1h"
    with pytest.raises(ValidationError):
        history.window_of("1y")
    now = datetime(2024, 5, 1, 12, 34, 56, tzinfo=UTC)
    for window in history.WINDOWS:
        axis = history.Axis(window, now)
        assert axis.count <= history.MAX_POINTS and axis.step % 60 == 0
        assert axis.times[-1] <= now < axis.times[-1] + timedelta(seconds=axis.step)
    assert history.Axis("1d", now).step == 720


def test_searched_tenants_are_checked_and_bounded() -> None:
    assert history.searched(["a, b", "a", ""]) == ["a", "b"]
    with pytest.raises(ValidationError):
        history.searched(["<script>"])
    with pytest.raises(ValidationError):
        history.searched([",".join(f"t{i}" for i in range(history.MAX_SEARCHED + 1))])


def test_queue_charts_keep_the_top_queues_and_sum_the_rest() -> None:
    now = T0 + timedelta(minutes=14, seconds=30)
    axis = history.Axis("15m", now)
    points = [
        core_history.QueuePoint(
            axis.times[i], f"q{n}", n * 10 + i, n, 0, float(n), None if n else 0.5, 6, 1
        )
        for n in range(history.TOP_QUEUES + 2)
        for i in (axis.count - 2, axis.count - 1)
    ]
    found = history._queue_charts(axis, points)
    backlog = found["backlog"]["series"]
    assert [s["name"] for s in backlog] == [f"q{n}" for n in range(9, 1, -1)] + ["other"]
    assert backlog[-1]["values"][-1] == 14 + 24  # q0 and q1 summed, at the last minute
    assert found["oldest_wait"]["series"][-1]["values"][-1] == 1.0  # the largest of the rest
    completed, died = found["throughput"]["series"]
    assert completed["values"][-2] == 6 * 10 and died["values"][-2] == 10
    assert completed["values"][-1] is None and completed["values"][0] is None  # partial; none
    # The legend's figures are the last count's (q0's and q1's summed in "other").
    assert [s["now"] for s in backlog] == [*range(9, 1, -1), 1]
    assert [s["now"] for s in found["oldest_wait"]["series"]] == [None] * 8 + [0.5]


def test_every_series_has_a_legend_mark_in_its_colour_and_dash() -> None:
    series = [
        {"name": "completed", "values": [1, 2, 3]},
        {"name": "demand", "values": [4, 5, 6], "dashed": True},
        {"name": "b1", "values": [7, 7, 7]},
        {"name": "b2", "values": [7, 7, 7]},
    ]
    figure = parsed(charts.svg(chart(series, count=3)))
    marks = {li.attrib["data-series"]: li.find(f"{SVG}svg/{SVG}line") for li in figure.iter("li")}
    assert all(mark is not None for mark in marks.values()), marks
    assert {n: m.attrib["class"] for n, m in marks.items() if m is not None} == {
        "completed": "s0",
        "demand": "s1 dash",
        "b1": "s2",
        "b2": "s3",
    }
    # A series dashed apart from one it lies on has the same dash in its mark.
    b2 = marks["b2"]
    assert b2 is not None and b2.attrib["stroke-dasharray"] == charts.DASHES[0]


def test_dashed_lines_are_drawn_over_solid_ones_and_the_legend_says_where_they_lie() -> None:
    series = [
        {"name": "fair share", "values": [3, 2, 1], "dashed": True},
        {"name": "completed", "values": [3, 5, 1]},
        {"name": "waiting", "values": [0, 0, 0]},
    ]
    figure = parsed(charts.svg(chart(series, count=3)))
    assert [p.attrib["data-series"] for p in figure.iter(SVG + "path")] == [
        "completed",
        "waiting",
        "fair share",
    ]
    note = figure.find("p")
    assert note is not None and note.attrib["class"] == "legend-note"
    assert note.text == (
        "Dashed lines are drawn over solid ones: fair share lies on completed where they are equal."
    )
    # Apart from one another, or all solid: no note.
    alone = [{"name": "a", "values": [1, 2, 3]}, {"name": "b", "values": [2, 3, 4]}]
    assert parsed(charts.svg(chart(alone, count=3))).find("p") is None
