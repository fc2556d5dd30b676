"""The producer's capacity cache: each limited tenant's waiting work as
last read, plus what this process enqueued since, checked on every enqueue
without a database round trip; refreshed beside the enqueues
(`ProducerCore._refresh`)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from rota.buffer.entries import TaskBatch
from rota.buffer.streams import tenant_costs
from rota.errors import CapacityExceeded


@dataclass
class CapacityCache:
    """Each limited tenant's waiting work as last read, plus what this
    process enqueued since: no database round trip per call.

    A refresh reads the buffer's counts (on the request path: Redis, fast),
    then PostgreSQL's (in the background), and `land`s them. What this
    process counts from the buffer read on is kept apart (`since_read`), as
    the figures landed do not hold it: a write counted after that mark is
    counted again on top of them, never lost (a write that raced the read
    may be counted twice until the next refresh: more back-pressure, never
    less; so may work a loader moves between the two reads). Request threads
    `check` and `count` while a refresh lands from another thread: all four
    go under one lock, which `check` and `count` take only for a batch that
    names a limited tenant."""

    max_age: float
    fetched_at: float = float("-inf")  # when the last refresh began or failed
    limits: dict[str, tuple[int, float]] = field(default_factory=dict)
    # Whether a refresh has landed or failed in this process: until then, an
    # enqueue waits for the first one (bounded; `ProducerCore._refresh`).
    known: bool = False
    since_fetch: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    since_read: defaultdict[str, float] | None = None  # while a refresh is under way
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stale(self) -> bool:
        return time.monotonic() - self.fetched_at >= self.max_age

    def mark(self) -> None:
        """A refresh begins: its buffer read comes next."""
        with self.lock:
            self.since_read = defaultdict(float)
            self.fetched_at = time.monotonic()

    def land(
        self, backlogs: dict[str, tuple[int, float]], buffered: dict[str, float] | None = None
    ) -> None:
        """`backlogs`: {tenant: (capacity, work waiting in PostgreSQL)};
        `buffered`: {tenant: work in the Redis buffer}, read at the `mark`."""
        buffered = buffered or {}
        limits = {
            tenant: (capacity, waiting + buffered.get(tenant, 0.0))
            for tenant, (capacity, waiting) in backlogs.items()
        }
        with self.lock:
            self.limits = limits
            self.since_fetch = self.since_read or defaultdict(float)
            self.since_read = None
            self.known = True

    def refresh(
        self, backlogs: dict[str, tuple[int, float]], buffered: dict[str, float] | None = None
    ) -> None:
        """Marks and lands at once (figures read now)."""
        self.mark()
        self.land(backlogs, buffered)

    def postpone(self) -> None:
        """The refresh failed: keep the cached figures (and everything counted
        since) until the next one is due, rather than ask again on every call."""
        with self.lock:
            self.since_read = None
            self.fetched_at = time.monotonic()
            self.known = True

    def check(self, batch: TaskBatch) -> None:
        limits = self.limits
        if not limits:
            return
        adding: defaultdict[str, float] = defaultdict(float)
        for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
            if tenant in limits:
                adding[tenant] += cost
        if not adding:
            return
        with self.lock:  # figures and counts of one refresh, not half of two
            limits, counted = self.limits, self.since_fetch
            for tenant, cost in adding.items():
                if tenant not in limits:
                    continue
                capacity, backlog = limits[tenant]
                waiting = backlog + counted.get(tenant, 0.0)
                if waiting + cost > capacity:
                    raise CapacityExceeded(tenant, waiting, capacity)

    def count(self, batch: TaskBatch) -> None:
        limits = self.limits
        if not limits:
            return
        adding = tenant_costs(batch, limits)
        if not adding:
            return
        with self.lock:
            for tenant, cost in adding.items():
                self.since_fetch[tenant] += cost
                if self.since_read is not None:
                    self.since_read[tenant] += cost


@dataclass
class Refreshing:
    """The refresh under way: at most one per producer (ProducerCore)."""

    started: float
    done: threading.Event = field(default_factory=threading.Event)
