"""The chaos suite, short: faults one after another under load (kill -9 of the
loader, a worker, the producer and the maintenance leader; Redis killed and
restarted from its AOF; PostgreSQL stopped with -m immediate, and then for
longer than a lease), and the total-queue rule checked, with the tenant
limit and a limit on keys held. `rota bench chaos`
runs the same, longer, with a Spark loader too, and reports the figures."""

from __future__ import annotations

import pytest

from rota_tools.bench.chaos import run_chaos
from rota_tools.bench.chaosapp import KEY_LIMIT
from rota_tools.bench.faults import LIMIT


@pytest.mark.slow(reason="seven faults one after another under load, each until it recovers")
def test_every_acknowledged_task_runs_through_every_fault() -> None:
    report = run_chaos(
        rate=100.0, baseline_seconds=4.0, settle_seconds=5.0, pg_pause_seconds=2.0, spark=False
    )
    assert report["drained"], report["left_at_end"]
    assert report["acknowledged"] > 1000, report
    assert report["lost"] == 0, report  # the total-queue rule
    assert report["ran_twice_at_once"] == 0, report
    assert report["stale_completions_accepted"] == 0, report
    assert report["limit_violations"] == 0 and report["peak_running_of_limited_tenant"] <= LIMIT
    # The limit on keys, over every tenant, holds through the same faults.
    assert report["keyed_runs"] > 100 and report["peak_running_of_limited_key"] <= KEY_LIMIT
    assert report["duplicates_by_cause"].get("unexplained", 0) == 0, report["duplicates_by_cause"]
    assert report["left_at_end"] == {
        "buffer": 0,
        "ready": 0,
        "running": 0,
        "scheduled": 0,
        "parked": 0,
        "dead": 0,
        "dead_letters": 0,
    }
    assert report["maintenance_leader_overlaps"] == 0
    assert report["processes_stayed_up"], report
    assert len(report["faults"]) == 7
