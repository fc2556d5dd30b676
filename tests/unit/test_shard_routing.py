"""The sharding simulation's routing: rendezvous hashing of tenant names."""

from __future__ import annotations

from collections import Counter

from rota_tools.bench.shards import shard_of

TENANTS = [f"tenant-{i}" for i in range(3000)]


def test_tenants_spread_evenly_over_shards() -> None:
    counts = Counter(shard_of(t, 3) for t in TENANTS)
    assert set(counts) == {0, 1, 2}
    assert all(800 <= n <= 1200 for n in counts.values()), counts


def test_adding_a_shard_moves_only_the_tenants_it_wins() -> None:
    moved = [t for t in TENANTS if shard_of(t, 3) != shard_of(t, 4)]
    assert all(shard_of(t, 4) == 3 for t in moved)  # each to the new shard, none between old ones
    assert 600 <= len(moved) <= 900  # about a quarter


def test_a_tenants_shard_does_not_depend_on_the_process() -> None:
    # Pinned: a hash salted per process (Python's hash()) would move tenants
    # at every restart.
    names = ["acme", "globex", "initech", "umbrella", "hooli"]
    assert [shard_of(t, 3) for t in names] == [0, 2, 0, 0, 0]
    assert shard_of("acme", 1) == 0
