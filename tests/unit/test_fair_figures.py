"""The figures of fair share as every surface shows them (rota.core.history:
one rule for "at its fair share", one wording) and the charts' figures
without float residue (rota.dashboard.history)."""

from __future__ import annotations

from datetime import UTC, datetime

from rota.core import history as core_history
from rota.core.history import FairShare, fair_share, within_rounding, wording
from rota.dashboard import charts, history
from rota.readmodel.figures import Figures
from rota.readmodel.metrics import figures_text


def test_a_tenant_served_within_rounding_of_its_fair_share_is_at_it() -> None:
    # The flood tenant that took what the small tenants left: each minute's
    # water-fill owed them their tasks unfinished at its end, so its own
    # share came out 4 tasks (0.8 a minute) below what it got.
    flood = fair_share(5, served=2500, demand=3000, fair=2496.0)
    assert flood == FairShare(5, 500.0, 600.0, 500.0, "at")
    assert not flood.held_back
    # Never shown above its fair share by a rounding artefact...
    assert fair_share(5, served=3000, demand=3000, fair=2999.0).standing == "at"
    # ...but above or below it beyond rounding.
    assert fair_share(5, served=300, demand=600, fair=200.0) == FairShare(
        5, 60.0, 120.0, 40.0, "above"
    )
    held = fair_share(5, served=0, demand=4, fair=4.0)
    assert held == FairShare(5, 0.0, 0.8, 0.8, "below") and held.held_back
    # Asked for nothing: owed nothing, whatever the levels.
    assert fair_share(5, served=0, demand=0, fair=None) == FairShare(5, 0.0, 0.0, 0.0, "at")
    # No level kept: no fair share, no standing.
    assert fair_share(5, served=10, demand=12, fair=None) == FairShare(5, 2.0, 2.4, None, None)


def test_tasks_in_flight_at_the_windows_end_are_not_held_back() -> None:
    # Served as fast as it sends (20 a minute), one task in flight when the
    # window ended: owed it, short of it by that task, not held back.
    trickle = fair_share(5, served=99, demand=100, fair=100.0, unfinished=1, last_completed=20)
    assert trickle == FairShare(5, 19.8, 20.0, 19.8, "at")
    # Its tasks waiting with none served: held back, however few.
    held = fair_share(5, served=0, demand=4, fair=4.0, unfinished=4, last_completed=0)
    assert held.standing == "below"
    # Served 100 a minute of the 120 owed, 100 left: a minute's work, not
    # the few seconds' in flight: held back.
    slow = fair_share(5, served=500, demand=600, fair=600.0, unfinished=100, last_completed=100)
    assert slow == FairShare(5, 100.0, 120.0, 120.0, "below")


def test_rounding_is_the_shown_digit_or_three_significant_digits() -> None:
    assert within_rounding(0.0, 0.05) and not within_rounding(0.0, 0.06)
    assert within_rounding(1000.0, 995.0) and not within_rounding(1000.0, 994.0)
    # Figures per minute carry no float residue.
    assert fair_share(3, served=1, demand=1, fair=1.0000000000000002).fair_share_per_minute == (
        0.333
    )
    assert core_history.shown(2.9999999999999996) == 3.0


def test_one_wording_on_every_surface() -> None:
    assert (
        wording(500.0, 500.0, 600.0, "at")
        == "served 500.0 of fair share 500.0, demand 600.0 (at its fair share)"
    )
    assert (
        wording(0.0, 0.8, 0.8, "below")
        == "served 0.0 of fair share 0.8, demand 0.8 (below its fair share)"
    )
    assert wording(1234.5, None, 2000.0, None) == (
        "served 1,234.5, demand 2,000.0 (fair share not kept)"
    )


def test_other_is_the_total_less_the_series_shown_without_residue() -> None:
    shown = [{"values": [0.4, 1.0, None]}, {"values": [0.1, 2.0, None]}, {"values": [0.2, 0, 0]}]
    total = [0.1 + 0.2 + 0.4, 3.5, None]
    assert total[0] - sum([0.4, 0.1, 0.2]) > 0  # the residue a subtraction leaves
    assert history.rest_of(total, shown) == [0.0, 0.5, None]
    # Whatever a chart is given, it draws and labels no residue.
    axis = history.Axis("15m", datetime(2026, 11, 28, 12, 14, 30, tzinfo=UTC))
    residue = 5.684341886080802e-14
    chart = axis.chart(
        "c", "t", "tasks per minute", [{"name": "other", "values": [residue], "now": -residue}]
    )
    assert chart["series"][0]["values"] == [0.0] and chart["series"][0]["now"] == 0.0
    assert "e-" not in charts.number(chart["series"][0]["values"][0])


def test_the_top_tenants_fair_shares_are_gauges() -> None:
    figures = Figures(
        datetime.now(UTC),
        fair={
            "acme": FairShare(5, 500.0, 600.0, 500.0, "at"),
            "b1": FairShare(5, 20.0, 20.0, None, None),
        },
    )
    text = figures_text(figures)
    assert 'rota_tenant_served_per_minute{tenant="acme"} 500.0' in text
    assert 'rota_tenant_demand_per_minute{tenant="acme"} 600.0' in text
    assert 'rota_tenant_fair_share_per_minute{tenant="acme"} 500.0' in text
    assert 'rota_tenant_served_per_minute{tenant="b1"} 20.0' in text
    assert 'rota_tenant_fair_share_per_minute{tenant="b1"}' not in text  # not kept
