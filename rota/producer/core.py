"""The producer's decisions: capacity, circuit breaker, buffer bound,
fallback, and what counts as stored.

Written once, in `ProducerCore.store`, as a generator of effects (rota.core.effects);
rota.producer.clients carries them out with redis-py and psycopg, sync or
asyncio. A task id is returned only once the task is durably stored
somewhere; otherwise the caller gets `EnqueueError`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from uuid import UUID

import redis

from rota.buffer.entries import TaskBatch
from rota.buffer.redis_client import SERVER_LOST, WRITE_REFUSED
from rota.buffer.streams import (
    all_streams,
    backlog_key,
    encode_entries,
    shard_for,
    stream_name,
    tenant_costs,
)
from rota.errors import CapacityExceeded, EnqueueError
from rota.model.envelope import TaskEnvelope
from rota.producer.breaker import BreakerState, CircuitBreaker
from rota.runtime.outage import Backoff, Outage
from rota.settings import Settings

log = logging.getLogger("rota.producer")

# Redis cannot take writes now: out of reach, or refusing writes
# (rota.buffer.redis_client). The producer retries, then falls back to
# PostgreSQL and counts a failure towards the breaker (falling back after a
# write no replica confirmed is safe: a task stored twice under its id is
# loaded once). Any other error is unexpected.
REDIS_ERRORS: tuple[type[Exception], ...] = (*SERVER_LOST, *WRITE_REFUSED)

# The waits between a write's retries: short, as the enqueue waits on them.
# The first retry goes at once (a dropped connection is usually back on a new
# one; rota.runtime.outage.with_retries).
WRITE_BACKOFF = Backoff(base=0.02, cap=0.1)


@dataclass(frozen=True)
class WriteBuffer:
    """XADD the entries; add the capacity-limited tenants' work to the shards'
    backlog hashes. The result is each stream's length after the write (if
    `measure`, else nothing)."""

    entries: dict[str, list[dict[bytes, bytes]]]
    backlog: dict[str, dict[str, float]] = field(default_factory=dict)
    measure: bool = True  # also read each stream's length (XLEN)
    # Acknowledged only once this many replicas have the write (WAIT, for
    # up to `wait_seconds`).
    replicas: int = 0
    wait_seconds: float = 0.0


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

    def retries(self, effect: Effect) -> int:
        """How many times a Redis effect is tried again after its first
        attempt failed (waiting per WRITE_BACKOFF): a write ROTA_REDIS_RETRIES
        times, then the fallback; a probe or a read not at all (the write
        that follows tells)."""
        return self.settings.redis_retries if isinstance(effect, WriteBuffer) else 0

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
                        entries,
                        self._backlog(batch),
                        measure=self._lengths_stale(),
                        replicas=self.settings.redis_wait_replicas,
                        wait_seconds=self.settings.redis_timeout / 2,  # inside the socket timeout
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
