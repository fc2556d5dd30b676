"""A rolling upgrade under load (rota_tools.bench.upgrade): the producer,
loader and workers of the version before the newest migration keep running
while this version's `rota migrate` is applied, then are replaced one by
one. Nothing acknowledged is lost, no limit is exceeded, and no process is
stopped by the migration. The old version is found from git history, so
each migration to come is run against the version it upgrades."""

from __future__ import annotations

import pytest

from rota_tools.bench.faults import LIMIT
from rota_tools.bench.upgrade import run_rolling_upgrade
from tests.helpers import shallow_clone


@pytest.mark.skipif(shallow_clone(), reason="the earlier version comes from git history")
@pytest.mark.slow(reason="two versions of the pipeline, one after the other, under load")
def test_a_rolling_upgrade_under_load_loses_nothing() -> None:
    report = run_rolling_upgrade(rate=60.0, seconds=3.0)
    assert report["old_processes_survived_the_migration"], report
    assert report["new_migrate"] != "applied migrations: []", report  # something to upgrade
    assert report["processes_stayed_up"], report
    assert report["drained"], report["left_at_end"]
    assert report["lost"] == 0, report["lost_examples"]
    assert report["ran_twice_at_once"] == 0, report
    assert report["stale_completions_accepted"] == 0, report
    assert report["limit_violations"] == 0
    assert report["peak_running_of_limited_tenant"] <= LIMIT
    assert report["runs_by_version"]["old"] > 50 and report["runs_by_version"]["new"] > 50
    assert report["left_at_end"]["dead"] == report["left_at_end"]["dead_letters"] == 0
