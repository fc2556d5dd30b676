"""The producer: validated tasks into the Redis buffer, or PostgreSQL when Redis is down.

The decisions (capacity, circuit breaker, fallback, what counts as stored) are
written once, in `ProducerCore.store`, as a generator of effects; `Producer`
and `AsyncProducer` only carry the effects out, with redis-py and psycopg's
sync or asyncio clients. A task id is returned only once the task is durably
stored somewhere; otherwise the caller gets `EnqueueError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from uuid import UUID

import psycopg
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from rota import db, ops
from rota.buffer import (
    all_streams,
    backlog_key,
    encode_entries,
    shard_for,
    stream_name,
    tenant_costs,
)
from rota.effects import adrive, drive
from rota.envelope import TaskBatch, TaskEnvelope
from rota.errors import CapacityExceeded, EnqueueError
from rota.outage import Outage
from rota.producer.breaker import BreakerState, CircuitBreaker
from rota.settings import Settings

log = logging.getLogger("rota.producer")

# Redis cannot take writes now: lost, timed out, out of memory, a read-only
# replica, loading its data set, or its master down. The producer retries,
# then falls back to PostgreSQL and counts a failure towards the breaker.
# (BusyLoadingError is a ConnectionError.) Any other error is unexpected.
REDIS_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
)


@dataclass(frozen=True)
class WriteBuffer:
    """XADD the entries; add the capacity-limited tenants' work to the shards'
    backlog hashes. The result is each stream's length after the write (if
    `measure`, else nothing)."""

    entries: dict[str, list[dict[bytes, bytes]]]
    backlog: dict[str, dict[str, float]] = field(default_factory=dict)
    measure: bool = True  # also read each stream's length (XLEN)


@dataclass(frozen=True)
class ProbeBuffer:
    """Each stream's length."""

    streams: list[str]


@dataclass(frozen=True)
class ReadBufferBacklogs:
    """{tenant: cost units in the buffer}, summed over the shards' backlog hashes."""

    keys: list[str]


@dataclass(frozen=True)
class LoadDatabase:
    envelopes: list[TaskEnvelope]
    connection: Any = None  # the caller's connection (transactional enqueue), else ours


@dataclass(frozen=True)
class FetchBacklogs:
    pass


Effect: TypeAlias = WriteBuffer | ProbeBuffer | ReadBufferBacklogs | LoadDatabase | FetchBacklogs
Flow: TypeAlias = Generator[Effect, Any, list[UUID]]


@dataclass
class CapacityCache:
    """Each limited tenant's waiting work, refreshed every `max_age` seconds,
    plus what this process enqueued since: no database round trip per call."""

    max_age: float
    fetched_at: float = float("-inf")
    limits: dict[str, tuple[int, float]] = field(default_factory=dict)
    since_fetch: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def stale(self) -> bool:
        return time.monotonic() - self.fetched_at >= self.max_age

    def refresh(
        self, backlogs: dict[str, tuple[int, float]], buffered: dict[str, float] | None = None
    ) -> None:
        """`backlogs`: {tenant: (capacity, work waiting in PostgreSQL)};
        `buffered`: {tenant: work still in the Redis buffer}."""
        buffered = buffered or {}
        self.limits = {
            tenant: (capacity, waiting + buffered.get(tenant, 0.0))
            for tenant, (capacity, waiting) in backlogs.items()
        }
        self.since_fetch.clear()
        self.fetched_at = time.monotonic()

    def postpone(self) -> None:
        """The refresh failed: keep the cached figures until the next one is
        due, rather than ask the database again on every call."""
        self.fetched_at = time.monotonic()

    def check(self, batch: TaskBatch) -> None:
        if not self.limits:
            return
        adding: defaultdict[str, float] = defaultdict(float)
        for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
            if tenant in self.limits:
                adding[tenant] += cost
        for tenant, cost in adding.items():
            capacity, backlog = self.limits[tenant]
            waiting = backlog + self.since_fetch[tenant]
            if waiting + cost > capacity:
                raise CapacityExceeded(tenant, waiting, capacity)

    def count(self, batch: TaskBatch) -> None:
        if not self.limits:
            return
        for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
            if tenant in self.limits:
                self.since_fetch[tenant] += cost


class ProducerCore:
    """What to do with a batch of tasks; shared by the sync and async producers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_reset_seconds)
        # The breaker decides when to try Redis again; this only logs the
        # outage's start and end (enqueues meanwhile go to PostgreSQL).
        self.redis_outage = Outage("the Redis buffer (enqueues go to PostgreSQL)", log)
        self.capacity = CapacityCache(settings.capacity_cache_seconds)
        self.fallbacks = 0  # tasks that went straight to PostgreSQL
        self.streams = all_streams(settings.stream_prefix, settings.shards)
        # Each shard's length as of the last write or probe (the buffer bound).
        self.shard_lengths: dict[str, int] = {}
        self.lengths_at = float("-inf")

    def retry_policy(self) -> dict[str, Any]:
        """Bounded retries of a Redis write (tenacity), then the fallback."""
        return {
            "stop": stop_after_attempt(self.settings.redis_retries + 1),
            "wait": wait_exponential_jitter(multiplier=0.01, max=0.1, jitter=0.01),
            "retry": retry_if_exception_type(REDIS_ERRORS),
            "reraise": True,
        }

    def store(self, batch: TaskBatch, connection: Any = None) -> Flow:
        ids = list(batch.ids)
        if not batch:
            return ids
        if self.capacity.stale():
            yield from self._refresh_capacities()
        self.capacity.check(batch)

        if connection is not None:
            # Transactional enqueue: in the caller's transaction, or not at all.
            yield LoadDatabase(batch.envelopes(), connection)
            self.capacity.count(batch)
            return ids

        if self.breaker.allow():
            entries = encode_entries(batch, self.settings.stream_prefix, self.settings.shards)
            if (yield from self._buffer_full(entries)):
                self.breaker.succeeded()  # Redis answered: full, not down
            else:
                try:
                    lengths = yield WriteBuffer(
                        entries, self._backlog(batch), measure=self._lengths_stale()
                    )
                except REDIS_ERRORS as exc:
                    self.breaker.failed()
                    self.redis_outage.failed(exc)  # logged once, when it starts
                except Exception as exc:
                    raise EnqueueError(
                        f"{len(batch)} task(s) not stored: the Redis buffer refused the write "
                        f"({type(exc).__name__}: {exc})"
                    ) from exc
                else:
                    self.breaker.succeeded()
                    self.redis_outage.recovered()
                    self._note_lengths(lengths)
                    self.capacity.count(batch)
                    return ids
        try:
            yield LoadDatabase(batch.envelopes())
        except Exception as exc:
            raise EnqueueError(
                f"{len(batch)} task(s) not stored: the Redis buffer is unavailable and "
                f"PostgreSQL failed too ({exc}); enqueue again (with an idempotency_key to be "
                "safe against duplicates)"
            ) from exc
        self.fallbacks += len(batch)
        self.capacity.count(batch)
        return ids

    def _refresh_capacities(self) -> Generator[Effect, Any, None]:
        try:
            backlogs = yield FetchBacklogs()
        except Exception as exc:
            # PostgreSQL down must not cost every enqueue a connection attempt.
            self.capacity.postpone()
            log.warning(
                "could not refresh tenant capacities, using the cached ones for %s s: %s",
                self.capacity.max_age,
                exc,
            )
            return
        buffered: dict[str, float] = {}
        if backlogs and self.breaker.state is BreakerState.CLOSED:
            try:
                buffered = yield ReadBufferBacklogs([backlog_key(s) for s in self.streams])
            except (redis.RedisError, OSError) as exc:  # PostgreSQL's count alone meanwhile
                log.warning("could not read the buffer's backlog counts: %s", exc)
        self.capacity.refresh(backlogs, buffered)

    def _backlog(self, batch: TaskBatch) -> dict[str, dict[str, float]]:
        """The work `batch` adds to each shard's backlog hash (capacity-limited
        tenants only: the others need no count)."""
        if not self.capacity.limits:
            return {}
        shards = self.settings.shards
        backlog: dict[str, dict[str, float]] = {}
        for tenant, cost in tenant_costs(batch, self.capacity.limits).items():
            key = backlog_key(stream_name(self.settings.stream_prefix, shard_for(tenant, shards)))
            backlog.setdefault(key, {})[tenant] = cost
        return backlog

    def _note_lengths(self, lengths: dict[str, int]) -> None:
        if lengths:
            self.shard_lengths.update(lengths)
            self.lengths_at = time.monotonic()

    def _lengths_stale(self) -> bool:
        """Whether a write should also read the shards' lengths: at most every
        ROTA_CAPACITY_CACHE_SECONDS (a command more per write costs a single
        enqueue a tenth of its time)."""
        return time.monotonic() - self.lengths_at >= self.settings.capacity_cache_seconds

    def _buffer_full(self, entries: dict[str, list[Any]]) -> Generator[Effect, Any, bool]:
        """Whether writing `entries` would take a shard past ROTA_BUFFER_MAX_ENTRIES,
        judged from the lengths the last write returned; while a shard is
        full, it is probed again every ROTA_CAPACITY_CACHE_SECONDS."""
        limit = self.settings.buffer_max_entries

        def full() -> list[str]:
            return [s for s in entries if self.shard_lengths.get(s, 0) + len(entries[s]) > limit]

        if not full():
            return False
        if time.monotonic() - self.lengths_at >= self.settings.capacity_cache_seconds:
            try:
                self._note_lengths((yield ProbeBuffer(full())))
            except Exception:
                return False  # the write itself will tell what is wrong
        over = full()
        if over:
            log.warning(
                "buffer shard(s) %s hold ROTA_BUFFER_MAX_ENTRIES=%d entries: writing to PostgreSQL",
                ", ".join(over),
                limit,
            )
        return bool(over)


def _queue_write(pipe: Any, effect: WriteBuffer) -> None:
    """Queues a WriteBuffer on a pipeline: the XADDs, then one XLEN per
    stream, then the backlog counts (read back by `_lengths`)."""
    for stream, entries in effect.entries.items():
        for fields in entries:
            pipe.xadd(stream, fields)
    if effect.measure:
        for stream in effect.entries:
            pipe.xlen(stream)
    for key, costs in effect.backlog.items():
        for tenant, cost in costs.items():
            pipe.hincrbyfloat(key, tenant, cost)


def _lengths(effect: WriteBuffer, replies: list[Any]) -> dict[str, int]:
    if not effect.measure:
        return {}
    start = sum(len(entries) for entries in effect.entries.values())
    return {
        stream: int(length)
        for stream, length in zip(
            effect.entries, replies[start : start + len(effect.entries)], strict=True
        )
    }


def _sum_backlogs(replies: list[Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for counts in replies:
        for tenant, cost in counts.items():
            name = tenant.decode() if isinstance(tenant, bytes) else tenant
            total[name] = total.get(name, 0.0) + float(cost)
    return total


def _redis_options(settings: Settings) -> dict[str, Any]:
    return {
        "socket_timeout": settings.redis_timeout_seconds,
        "socket_connect_timeout": settings.redis_timeout_seconds,
        # Retries are ours (tenacity, then the fallback), not redis-py's.
        "retry": Retry(NoBackoff(), 0),
    }


class Producer:
    """Sync producer. Thread-safe; one per process is enough."""

    def __init__(self, settings: Settings, core: ProducerCore | None = None) -> None:
        self.core = core or ProducerCore(settings)
        self.settings = settings
        self._redis: redis.Redis | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._conn_lock = threading.Lock()

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                self.settings.redis_url, **_redis_options(self.settings)
            )
        return self._redis

    def store(self, batch: TaskBatch, connection: Any = None) -> list[UUID]:
        return drive(self.core.store(batch, connection), self._carry_out)

    def _carry_out(self, effect: Effect) -> Any:
        if isinstance(effect, WriteBuffer):
            for attempt in Retrying(**self.core.retry_policy()):
                with attempt:
                    pipe = self.redis.pipeline(transaction=False)
                    _queue_write(pipe, effect)
                    replies = pipe.execute()
            return _lengths(effect, replies)
        if isinstance(effect, ProbeBuffer | ReadBufferBacklogs):
            pipe = self.redis.pipeline(transaction=False)
            if isinstance(effect, ProbeBuffer):
                for stream in effect.streams:
                    pipe.xlen(stream)
                return dict(zip(effect.streams, map(int, pipe.execute()), strict=True))
            for key in effect.keys:
                pipe.hgetall(key)
            return _sum_backlogs(pipe.execute())
        if isinstance(effect, LoadDatabase) and effect.connection is not None:
            # In the caller's transaction (it commits or rolls back with it); a
            # transaction of its own only on an autocommit connection.
            if effect.connection.autocommit:
                return db.transact(effect.connection, ops.load(effect.envelopes))
            return db.run(effect.connection, ops.load(effect.envelopes))
        with self._conn_lock:
            conn = self._connection()
            try:
                if isinstance(effect, LoadDatabase):
                    return db.transact(conn, ops.load(effect.envelopes))
                return db.run(conn, ops.tenant_backlogs())
            except psycopg.OperationalError:
                self._drop_connection()
                raise

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(
                self.settings.database_url, connect_timeout=self.settings.database_timeout_seconds
            )
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
        with self._conn_lock:
            self._drop_connection()


class AsyncProducer:
    """asyncio producer (FastAPI, Starlette): the same flow, awaited."""

    def __init__(self, settings: Settings, core: ProducerCore | None = None) -> None:
        self.core = core or ProducerCore(settings)
        self.settings = settings
        self._redis: redis.asyncio.Redis | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._conn_lock = asyncio.Lock()

    @property
    def redis(self) -> redis.asyncio.Redis:
        if self._redis is None:
            self._redis = redis.asyncio.Redis.from_url(
                self.settings.redis_url, **_redis_options(self.settings)
            )
        return self._redis

    async def store(self, batch: TaskBatch, connection: Any = None) -> list[UUID]:
        return await adrive(self.core.store(batch, connection), self._carry_out)

    async def _carry_out(self, effect: Effect) -> Any:
        if isinstance(effect, WriteBuffer):
            async for attempt in AsyncRetrying(**self.core.retry_policy()):
                with attempt:
                    pipe = self.redis.pipeline(transaction=False)
                    _queue_write(pipe, effect)
                    replies = await pipe.execute()
            return _lengths(effect, replies)
        if isinstance(effect, ProbeBuffer | ReadBufferBacklogs):
            pipe = self.redis.pipeline(transaction=False)
            if isinstance(effect, ProbeBuffer):
                for stream in effect.streams:
                    pipe.xlen(stream)
                return dict(zip(effect.streams, map(int, await pipe.execute()), strict=True))
            for key in effect.keys:
                pipe.hgetall(key)
            return _sum_backlogs(await pipe.execute())
        if isinstance(effect, LoadDatabase) and effect.connection is not None:
            if effect.connection.autocommit:
                return await db.atransact(effect.connection, ops.load(effect.envelopes))
            return await db.arun(effect.connection, ops.load(effect.envelopes))
        async with self._conn_lock:
            conn = await self._connection()
            try:
                if isinstance(effect, LoadDatabase):
                    return await db.atransact(conn, ops.load(effect.envelopes))
                return await db.arun(conn, ops.tenant_backlogs())
            except psycopg.OperationalError:
                await self._drop_connection()
                raise

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await db.aconnect(
                self.settings.database_url, connect_timeout=self.settings.database_timeout_seconds
            )
        return self._conn

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        self._conn = None

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
        async with self._conn_lock:
            await self._drop_connection()
