"""Network faults under load (rota_tools.bench.network): every process in a
namespace of its own, its links to PostgreSQL and Redis cut silently (no
reset), for less and for more than a lease, half-open, slow and late. Nothing
acknowledged is lost, nothing runs twice at once, the limits hold, every
process notices a dead link within the bound it is given and carries on
when the link is back. `rota bench chaos --network` runs the same, longer."""

from __future__ import annotations

import pytest

from rota_tools import netns
from rota_tools.bench.chaosapp import KEY_LIMIT
from rota_tools.bench.faults import LIMIT
from rota_tools.bench.network import DEAD_LINK_SECONDS, run_network_chaos

pytestmark = pytest.mark.skipif(
    not netns.available(), reason="network namespaces need root and iproute2"
)


@pytest.mark.slow(reason="a dozen network faults one after another under load")
def test_nothing_acknowledged_is_lost_through_silent_partitions_half_open_and_slow_links() -> None:
    report = run_network_chaos(
        rate=80.0, baseline_seconds=6.0, settle_seconds=8.0, short_seconds=2.0, long_seconds=9.0
    )
    assert report["drained"], report["left_at_end"]
    assert report["acknowledged"] > 1000, report
    assert report["lost"] == 0, report["lost_examples"]
    assert report["ran_twice_at_once"] == 0, report
    assert report["stale_completions_accepted"] == 0, report
    assert report["limit_violations"] == 0, report
    assert report["peak_running_of_limited_tenant"] <= LIMIT
    assert report["peak_running_of_limited_key"] <= KEY_LIMIT
    assert report["processes_stayed_up"], report
    assert report["left_at_end"] == {
        "buffer": 0,
        "ready": 0,
        "running": 0,
        "scheduled": 0,
        "parked": 0,
        "dead": 0,
        "dead_letters": 0,
    }
    # Each watched process said the link was down within its bound (a
    # partition is noticed at the next wait on it: within the dead-link
    # bound, plus the loop's pause between rounds).
    for fault, seconds in report["detected_after_s"].items():
        assert seconds is not None and seconds <= DEAD_LINK_SECONDS + 3, (fault, seconds)
    # The console, cut off from both servers, answers a page that reads
    # PostgreSQL within the bound (503: a server is unavailable), and is
    # whole again soon after the link is back.
    console = report["console"]
    assert console["page_during_partition_s"] <= DEAD_LINK_SECONDS + 3, console
    assert console["status_during_partition"] == 503, console
    assert console["whole_again_after_s"] is not None and console["whole_again_after_s"] <= 5
    # And the pipeline came back after each.
    assert all(f["recovered_to_90pct_after_s"] is not None for f in report["faults"]), report
    # With 100 ms added each way, the loader behind the delay went on
    # loading tasks that ran, and never took its link for dead.
    latency = report["latency"]
    assert latency["runs_started_meanwhile"] > 0, latency
    assert latency["taken_for_dead_after_s"] is None, latency
