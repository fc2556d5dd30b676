"""The producer's decisions: capacity, circuit breaker, buffer bound,
fallback, and what counts as stored.

Written once, in `ProducerCore.store`, as a generator of effects (rota.core.effects);
rota.producer.clients carries them out with redis-py and psycopg, sync or
asyncio. A task id is returned only once the task is durably stored
somewhere; otherwise the caller gets `EnqueueError`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator
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
from rota.errors import EnqueueError
from rota.model.envelope import TaskEnvelope
from rota.producer.breaker import BreakerState, CircuitBreaker
from rota.producer.capacity import CapacityCache, Refreshing
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
    """{tenant: (capacity, work waiting in PostgreSQL)}: run off the request
    path only, by a `RefreshInBackground` flow."""


@dataclass(frozen=True)
class RefreshInBackground:
    """Start `flow` (effects of its own, FetchBacklogs among them) beside the
    caller, on the producer's PostgreSQL access for refreshes, and go on at
    once: a thread for the sync producer, an asyncio task for the async one.
    The result is nothing; the flow lands its figures itself. `ended` is
    called once it is over, run or not (a task cancelled before it started
    never runs the flow's own cleanup)."""

    flow: Generator[Effect, Any, None]
    ended: Callable[[], None]


@dataclass(frozen=True)
class AwaitRefresh:
    """Wait until `done` is set or `seconds` have passed, whichever comes
    first (the first refresh of a process: see `ProducerCore._refresh`)."""

    done: threading.Event
    seconds: float


Effect: TypeAlias = (
    WriteBuffer
    | ProbeBuffer
    | ReadBufferBacklogs
    | LoadDatabase
    | FetchBacklogs
    | RefreshInBackground
    | AwaitRefresh
)
Flow: TypeAlias = Generator[Effect, Any, list[UUID]]


class ProducerCore:
    """What to do with a batch of tasks; shared by the sync and async producers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_reset_seconds)
        # The breaker decides when to try Redis again; this only logs the
        # outage's start and end (enqueues meanwhile go to PostgreSQL).
        self.redis_outage = Outage("the Redis buffer (enqueues go to PostgreSQL)", log)
        self.capacity = CapacityCache(settings.capacity_cache_seconds)
        self.refreshing: Refreshing | None = None
        self._starting = threading.Lock()  # one refresh at a time, whichever thread asks
        _CORES.add(self)
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
            yield from self._refresh()
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

    def _refresh(self) -> Generator[Effect, Any, None]:
        """Starts a refresh of the capacities, unless one is under way: the
        buffer's counts read here (Redis), PostgreSQL's in the background
        (`_fetch`), so that an enqueue never waits on PostgreSQL to write to
        the buffer. The caller checks against the cached figures meanwhile.

        The first refresh of a process is waited for, up to
        ROTA_DATABASE_TIMEOUT_SECONDS: before it lands nothing is known of
        which tenants are limited, so enqueues could be neither checked nor
        counted in the buffer's counts (which producers add to only for the
        tenants they know to be limited), and a fleet restarted in a flood
        would let it in unseen. It costs one round trip per process when
        PostgreSQL answers; when it does not, each process's first enqueues
        wait that bound once, then go on unchecked until it lands (a refused
        connection fails it at once: no wait)."""
        cache = self.capacity
        with self._starting:
            running = self.refreshing
            if running is None:
                running = self.refreshing = Refreshing(time.monotonic())
                cache.mark()
                starts = True
            else:
                starts = False
        if not starts:
            if not cache.known:
                left = running.started + self.settings.database_timeout_seconds - time.monotonic()
                if left > 0:
                    yield AwaitRefresh(running.done, left)
            return  # one at a time: a hung refresh holds back no enqueue, starts no other
        buffered: dict[str, float] = {}
        if (cache.limits or not cache.known) and self.breaker.state is BreakerState.CLOSED:
            try:
                buffered = yield ReadBufferBacklogs([backlog_key(s) for s in self.streams])
            except (redis.RedisError, OSError) as exc:  # PostgreSQL's count alone meanwhile
                log.warning("could not read the buffer's backlog counts: %s", exc)
        try:
            yield RefreshInBackground(self._fetch(running, buffered), lambda: self._done(running))
        except Exception as exc:  # not started (no thread to be had): as a failed refresh
            self._failed(exc)
            self._done(running)
            return
        if not cache.known:
            yield AwaitRefresh(running.done, self.settings.database_timeout_seconds)

    def _fetch(
        self, running: Refreshing, buffered: dict[str, float]
    ) -> Generator[Effect, Any, None]:
        """The refresh's PostgreSQL part, run off the request path; lands the
        figures, or postpones the next refresh if PostgreSQL fails."""
        try:
            try:
                backlogs = yield FetchBacklogs()
            except Exception as exc:
                self._failed(exc)
                return
            self.capacity.land(backlogs, buffered)
        finally:  # also when closed unfinished (a producer's close cancels it)
            self._done(running)

    def _done(self, running: Refreshing) -> None:
        if self.refreshing is running:
            self.refreshing = None
        running.done.set()

    def _failed(self, exc: Exception) -> None:
        # PostgreSQL down must not cost every enqueue a connection attempt.
        self.capacity.postpone()
        log.warning(
            "could not refresh tenant capacities, using the cached ones for %s s: %s",
            self.capacity.max_age,
            exc,
        )

    def forked(self) -> None:
        """In a child process: the parent's refresh thread is not there, and
        a lock another thread held at the fork would stay held."""
        self.refreshing = None
        self._starting = threading.Lock()
        self.capacity.lock = threading.Lock()
        self.capacity.since_read = None

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


# The producers of this process, for `_forked`.
_CORES: weakref.WeakSet[ProducerCore] = weakref.WeakSet()


def _forked() -> None:
    for core in list(_CORES):
        core.forked()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)
