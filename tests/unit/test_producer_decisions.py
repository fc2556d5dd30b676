"""The producer's decisions (buffer, breaker, buffer bound, capacity,
fallback) against fakeredis: `ProducerCore.store` driven with the same Redis
commands the real producers send (rota.producer.clients), and a recording
stand-in for PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
import redis

from rota import App, Settings
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import all_streams, backlog_key, decode_entry
from rota.core.effects import drive
from rota.errors import CapacityExceeded, EnqueueError
from rota.producer.breaker import BreakerState, CircuitBreaker
from rota.producer.clients import AsyncProducer, Producer, queue_commands, result_of
from rota.producer.core import (
    AwaitRefresh,
    FetchBacklogs,
    LoadDatabase,
    ProbeBuffer,
    ProducerCore,
    ReadBufferBacklogs,
    RefreshInBackground,
    WriteBuffer,
)


class Harness:
    """Carries out a producer's effects: Redis ones on a fakeredis server,
    database ones recorded (or refused, when `database_down`). A refresh of
    the capacities started in the background lands at once, or, with
    `hold_refreshes`, when `land_refreshes` is called (PostgreSQL stalled
    until then)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.server = fakeredis.FakeServer()
        self.redis = fakeredis.FakeRedis(server=self.server)
        self.core = ProducerCore(settings)
        self.loaded: list[Any] = []
        self.backlogs: dict[str, tuple[int, float]] = {}
        self.database_down = False
        self.redis_error: Exception | None = None  # raised by the next writes
        self.effects: list[str] = []
        self.hold_refreshes = False
        self.held: list[RefreshInBackground] = []
        self.refresh_effects: list[str] = []

    def carry_out(self, effect: Any) -> Any:
        self.effects.append(type(effect).__name__)
        if isinstance(effect, RefreshInBackground):
            self.held.append(effect)
            if not self.hold_refreshes:
                self.land_refreshes()
            return None
        if isinstance(effect, AwaitRefresh):
            return effect.done.is_set()
        if isinstance(effect, WriteBuffer | ProbeBuffer | ReadBufferBacklogs):
            if self.redis_error is not None and isinstance(effect, WriteBuffer):
                raise self.redis_error
            pipe = self.redis.pipeline(transaction=False)
            queue_commands(pipe, effect)
            return result_of(effect, pipe.execute())
        if self.database_down:
            raise OSError("connection refused")
        if isinstance(effect, FetchBacklogs):
            return dict(self.backlogs)
        assert isinstance(effect, LoadDatabase)
        self.loaded.extend(effect.envelopes)
        return len(effect.envelopes)

    def land_refreshes(self) -> None:
        """Runs the refreshes started so far, as their thread would."""
        held, self.held = self.held, []
        for refresh in held:
            effects, self.effects = self.effects, self.refresh_effects
            try:
                drive(refresh.flow, self.carry_out)
            finally:
                refresh.ended()
                self.effects = effects

    def store(self, batch: TaskBatch) -> list[Any]:
        self.effects = []
        return drive(self.core.store(batch), self.carry_out)

    def buffered(self) -> list[str]:
        """The tenants of every task in the buffer, in stream order."""
        tenants: list[str] = []
        for stream in all_streams(self.settings.stream_prefix, self.settings.shards):
            for _, fields in self.redis.xrange(stream):
                batch, bad = decode_entry(fields, self.settings.max_payload_bytes)
                assert not bad
                tenants.extend(batch.tenants)
        return tenants


def make(**overrides: Any) -> tuple[App, Harness]:
    settings = Settings(**{"redis_retries": 0, "capacity_cache_seconds": 0, **overrides})
    return App(settings), Harness(settings)


def calls(app: App, *tenants: str, cost: float = 1.0) -> TaskBatch:
    return app.batch([app.prepare("mail.send", queue="mail", tenant=t, cost=cost) for t in tenants])


def test_tasks_go_to_the_buffer_when_redis_takes_them() -> None:
    app, h = make()
    ids = h.store(calls(app, "alice", "bob", "alice"))
    assert len(ids) == 3 and h.loaded == []
    assert sorted(h.buffered()) == ["alice", "alice", "bob"]
    assert h.core.breaker.state is BreakerState.CLOSED


def test_redis_down_falls_back_to_postgresql_and_opens_the_breaker() -> None:
    app, h = make(breaker_failures=2)
    h.server.connected = False
    for _ in range(2):
        ids = h.store(calls(app, "alice"))
        assert [e.id for e in h.loaded[-1:]] == ids
    assert h.core.breaker.state is BreakerState.OPEN
    assert h.core.fallbacks == 2
    # Open: straight to PostgreSQL, Redis not even tried.
    h.store(calls(app, "bob"))
    assert "WriteBuffer" not in h.effects and h.effects[-1] == "LoadDatabase"


def test_the_breaker_probes_redis_again_after_its_reset_time() -> None:
    app, h = make()
    now = [0.0]
    h.core.breaker = CircuitBreaker(1, reset_seconds=5.0, clock=lambda: now[0])
    h.server.connected = False
    h.store(calls(app, "alice"))
    assert h.core.breaker.state is BreakerState.OPEN
    h.server.connected = True
    h.store(calls(app, "alice"))
    assert h.buffered() == []  # still open: PostgreSQL
    now[0] = 5.0
    h.store(calls(app, "carol"))
    assert h.buffered() == ["carol"]
    assert h.core.breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize(
    "refusal",
    [
        redis.exceptions.OutOfMemoryError("OOM command not allowed"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica"),
        redis.exceptions.BusyLoadingError("LOADING Redis is loading the dataset in memory"),
        redis.exceptions.TryAgainError("TRYAGAIN"),
    ],
)
def test_redis_refusing_writes_falls_back(refusal: Exception) -> None:
    app, h = make()
    h.redis_error = refusal
    ids = h.store(calls(app, "alice"))
    assert [e.id for e in h.loaded] == ids


def test_any_other_redis_error_raises_and_stores_nothing() -> None:
    app, h = make()
    h.redis_error = redis.exceptions.ResponseError("WRONGTYPE Operation against a key")
    with pytest.raises(EnqueueError, match="refused the write"):
        h.store(calls(app, "alice"))
    assert h.loaded == [] and h.buffered() == []


def test_neither_server_can_store_it_raises() -> None:
    app, h = make()
    h.server.connected = False
    h.database_down = True
    with pytest.raises(EnqueueError, match="PostgreSQL failed too"):
        h.store(calls(app, "alice"))


def test_a_full_shard_sends_enqueues_to_postgresql() -> None:
    app, h = make(shards=1, buffer_max_entries=2)
    for tenant in ("a", "b"):
        h.store(calls(app, tenant))
    h.store(calls(app, "c"))
    assert h.buffered() == ["a", "b"]
    assert [e.tenant for e in h.loaded] == ["c"]
    assert h.core.breaker.state is BreakerState.CLOSED  # full is not down


def test_capacity_counts_work_in_postgresql_and_in_the_buffer() -> None:
    app, h = make(shards=1)
    h.backlogs = {"alice": (10, 4.0)}  # capacity 10, 4 waiting in PostgreSQL
    h.store(calls(app, "alice", cost=3.0))
    (stream,) = all_streams(h.settings.stream_prefix, 1)
    assert float(h.redis.hget(backlog_key(stream), "alice") or 0) == 3.0
    # 4 in PostgreSQL + 3 in the buffer + 4 more > 10.
    with pytest.raises(CapacityExceeded):
        h.store(calls(app, "alice", cost=4.0))
    h.store(calls(app, "bob", cost=100.0))  # no capacity set: no limit, no count
    assert h.redis.hget(backlog_key(stream), "bob") is None


def test_a_stale_cache_is_refreshed_beside_the_enqueue_not_before_it() -> None:
    app, h = make(shards=1)
    h.backlogs = {"alice": (3, 0.0)}
    h.store(calls(app, "alice"))  # the process's first refresh (landing at once here)
    assert h.effects == ["ReadBufferBacklogs", "RefreshInBackground", "WriteBuffer"]
    assert h.refresh_effects == ["FetchBacklogs"]
    h.hold_refreshes, h.refresh_effects = True, []  # PostgreSQL stalls from here on

    # Stale (ROTA_CAPACITY_CACHE_SECONDS=0): a refresh starts, the enqueue
    # goes on to the buffer without a PostgreSQL round trip.
    h.store(calls(app, "alice"))
    assert h.effects == ["ReadBufferBacklogs", "RefreshInBackground", "WriteBuffer"]
    assert h.core.refreshing is not None and len(h.held) == 1
    # One refresh at a time: the stalled one starts no other.
    h.store(calls(app, "alice"))
    assert h.effects == ["WriteBuffer"]
    # Meanwhile, the cached figures plus what was enqueued since: 3 of 3.
    with pytest.raises(CapacityExceeded):
        h.store(calls(app, "alice"))
    assert h.refresh_effects == []

    h.backlogs = {"alice": (10, 0.0)}  # raised while PostgreSQL was away
    h.land_refreshes()
    assert h.refresh_effects == ["FetchBacklogs"] and h.core.refreshing is None
    # Landed: 1 in the buffer at its read, 2 counted since, so 7 more fit.
    h.land_refreshes()
    h.hold_refreshes = False
    h.store(calls(app, "alice", cost=7.0))
    with pytest.raises(CapacityExceeded):
        h.store(calls(app, "alice"))


def test_the_first_refresh_is_waited_for_within_a_bound() -> None:
    app, h = make(shards=1, database_timeout_seconds=7)
    h.backlogs = {"alice": (1, 0.0)}
    h.hold_refreshes = True  # PostgreSQL stalled: the wait ends unanswered
    h.store(calls(app, "alice"))
    assert h.effects == ["ReadBufferBacklogs", "RefreshInBackground", "AwaitRefresh", "WriteBuffer"]
    h.store(calls(app, "alice"))  # the same refresh waited for, for what is left of the bound
    assert h.effects == ["AwaitRefresh", "WriteBuffer"]
    h.core.refreshing.started -= 7  # type: ignore[union-attr]
    h.store(calls(app, "alice"))  # past it: no more waits, unchecked until it lands
    assert h.effects == ["WriteBuffer"]
    h.land_refreshes()
    assert h.core.capacity.limits == {"alice": (1, 0.0)}


def test_a_failed_refresh_keeps_the_figures_and_waits_until_due() -> None:
    app, h = make(shards=1, capacity_cache_seconds=3600)
    h.backlogs = {"alice": (2, 0.0)}
    h.store(calls(app, "alice"))
    h.core.capacity.fetched_at = float("-inf")  # due
    h.database_down = True
    h.store(calls(app, "alice"))  # the refresh fails beside it
    assert h.core.refreshing is None and not h.core.capacity.stale()
    with pytest.raises(CapacityExceeded):  # the figures and the counts are kept
        h.store(calls(app, "alice"))
    assert "RefreshInBackground" not in h.effects


class FlakyPipelines:
    """A Redis client whose next `failures` pipelines fail as a dropped
    connection does; the ones after run on fakeredis."""

    def __init__(self, client: Any, failures: int) -> None:
        self.client = client
        self.failures = failures
        self.tries = 0

    def pipeline(self, transaction: bool = False) -> Any:
        self.tries += 1
        pipe = self.client.pipeline(transaction=transaction)
        if self.failures:
            self.failures -= 1

            def dropped() -> list[Any]:
                raise redis.ConnectionError("Connection reset by peer")

            pipe.execute = dropped
        return pipe


@pytest.mark.parametrize("failures, buffered", [(0, True), (2, True), (3, False)])
def test_the_producer_tries_a_write_again_up_to_redis_retries_times(
    failures: int, buffered: bool
) -> None:
    # Sync and asyncio producers alike: a write that fails is tried again,
    # ROTA_REDIS_RETRIES=2 times, before the fallback (PostgreSQL, down here).
    settings = Settings(
        redis_retries=2,
        capacity_cache_seconds=3600,
        database_url="postgresql://rota@127.0.0.1:1/none",
        database_timeout_seconds=1,
    )
    app = App(settings)
    server = fakeredis.FakeServer()
    sync = Producer(settings)
    sync.core.capacity.refresh({})
    sync._redis = flaky = FlakyPipelines(fakeredis.FakeRedis(server=server), failures)  # type: ignore[assignment]
    if buffered:
        sync.store(calls(app, "alice"))
    else:
        with pytest.raises(EnqueueError, match="not stored"):
            sync.store(calls(app, "alice"))
    assert flaky.tries == min(failures + 1, 3)

    async def via_asyncio() -> int:
        aproducer = AsyncProducer(settings)
        aproducer.core.capacity.refresh({})
        aflaky = FlakyPipelines(fakeredis.FakeAsyncRedis(server=server), failures)
        aproducer._redis = aflaky  # type: ignore[assignment]
        if buffered:
            await aproducer.store(calls(app, "bob"))
        else:
            with pytest.raises(EnqueueError, match="not stored"):
                await aproducer.store(calls(app, "bob"))
        return aflaky.tries

    assert asyncio.run(via_asyncio()) == min(failures + 1, 3)
    streams = all_streams(settings.stream_prefix, settings.shards)
    stored = fakeredis.FakeRedis(server=server)
    assert sum(stored.xlen(s) for s in streams) == (2 if buffered else 0)
