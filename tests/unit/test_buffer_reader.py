"""The Python loader's reader looks for other loaders' idle entries a few
times per idle period, not on every pass (a round trip per shard)."""

from __future__ import annotations

from typing import Any

import pytest

from rota.loader import reading
from rota.loader.reading import BufferReader
from rota.settings import Settings


class CountingRedis:
    def __init__(self) -> None:
        self.looks = 0

    def xautoclaim(self, *args: Any, **kwargs: Any) -> Any:
        self.looks += 1
        return [b"0-0", [], []]


def test_idle_entries_are_looked_for_a_few_times_per_idle_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(reading.time, "monotonic", lambda: now[0])
    client = CountingRedis()
    settings = Settings(loader_idle_reclaim_seconds=8.0)
    reader = BufferReader(client, settings, "c", ["s0", "s1"])  # type: ignore[arg-type]
    assert reader.reclaim() == ([], [])
    assert client.looks == 2  # at once, on every shard
    for _ in range(100):  # passes within a quarter of the idle period
        now[0] += 0.019
        reader.reclaim()
    assert client.looks == 2
    now[0] += 0.2
    reader.reclaim()
    assert client.looks == 4


def test_a_long_idle_period_is_still_looked_at_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(reading.time, "monotonic", lambda: now[0])
    client = CountingRedis()
    reader = BufferReader(client, Settings(loader_idle_reclaim_seconds=3600.0), "c", ["s"])  # type: ignore[arg-type]
    reader.reclaim()
    now[0] += reading.RECLAIM_LOOK_MAX_SECONDS
    reader.reclaim()
    assert client.looks == 2
