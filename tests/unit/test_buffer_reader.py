"""The Python loader's reader looks for other loaders' idle entries a few
times per idle period, not on every pass (a round trip per shard)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

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


class BlockingRedis:
    """Answers a blocking XREADGROUP as Redis does, with the one stream that
    woke it; a read that does not block gets every stream's entries."""

    def __init__(self, entries: dict[str, list[tuple[bytes, dict[bytes, bytes]]]]) -> None:
        self.entries = entries
        self.reads: list[tuple[list[str], Any]] = []

    def xreadgroup(self, group: str, consumer: str, streams: dict[str, str], **kw: Any) -> Any:
        self.reads.append((list(streams), kw.get("block")))
        ready = [s for s in streams if self.entries.get(s)]
        if kw.get("block") is not None:
            ready = ready[:1]
        return [[s, self.entries.pop(s)] for s in ready]


@pytest.mark.parametrize(
    ("spread", "reads", "entries"),
    [
        ({b"spread": b"3"}, 2, 3),  # the rest read at once, without blocking
        ({}, 1, 1),  # separate writes: the others wait for the next pass
        ({b"spread": b"x3"}, 1, 1),  # not a number: as if absent
    ],
)
def test_a_blocked_read_woken_by_part_of_a_spread_write_reads_the_rest(
    spread: dict[bytes, bytes], reads: int, entries: int
) -> None:
    client = BlockingRedis(
        {s: [(b"1-0", {b"v": b"2", b"tasks": b"{}", **spread})] for s in ("s0", "s1", "s2")}
    )
    reader = BufferReader(client, Settings(), "c", ["s0", "s1", "s2"])  # type: ignore[arg-type]
    assert len(reader.read_new(500)) == entries
    assert len(client.reads) == reads
    if reads == 2:
        assert client.reads[1] == (["s1", "s2"], None)


class FailingSecondRead(BlockingRedis):
    def xreadgroup(self, group: str, consumer: str, streams: dict[str, str], **kw: Any) -> Any:
        if self.reads:
            raise redis.ConnectionError("Redis went away")
        return super().xreadgroup(group, consumer, streams, **kw)


def test_a_failed_second_read_keeps_the_entries_of_the_first() -> None:
    spread = {b"v": b"2", b"tasks": b"{}", b"spread": b"2"}
    client = FailingSecondRead({s: [(b"1-0", dict(spread))] for s in ("s0", "s1")})
    reader = BufferReader(client, Settings(), "c", ["s0", "s1"])  # type: ignore[arg-type]
    assert [stream for stream, _, _ in reader.read_new(500)] == ["s0"]
