"""The in-memory queue's store: what PostgreSQL does for rota, for tests.

Loading ignores ids seen before (idempotency keys, as `rota.core.load`); a
task whose ETA is later waits scheduled. Order is rota's start-time fair
queueing (docs/explanation/architecture.md, "Fairness"): each queue has a virtual clock
`V` (the smallest start tag waiting, or the largest given), each tenant a
weight `w` (1 unless given) and per queue a finish tag `F`; a task of cost
`c` entering the line starts at `S = max(V, F)` and moves `F` to `S + c/w`;
the next turn is the lowest `(S, tenant slot, arrival)`. A scheduled
task gets its place when it falls due. With `w = c = 1` that is round-robin.
Priority is within a tenant, as `rota.claim` has it: a turn runs the
tenant's most urgent task waiting in that queue (then the earliest), and the
task whose turn it was takes that task's place.

A failed attempt is decided as `rota.fail` (rota/sql/functions/reports.sql) decides it,
and its backoff is `rota.backoff_seconds`'; tests/unit/test_testing.py pins
both to the SQL, so that the two cannot drift apart.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections.abc import Callable, Container, Iterable, Mapping
from datetime import datetime, timedelta
from uuid import UUID

from rota import core
from rota.model.envelope import TaskEnvelope
from rota.runtime.redact import redact
from rota.testing.records import Outcome, TaskRecord

Entry = tuple[float, int, int, TaskRecord]  # (start tag, tenant slot, arrival, task)
UNFINISHED = ("pending", "scheduled", "running")


def backoff_seconds(
    attempt: int, base: float, most: float, jitter: Callable[[], float] = random.random
) -> float:
    """rota.backoff_seconds: exponential, with "equal jitter" (half fixed, half random)."""
    delay = min(most, base * 2.0 ** min(attempt - 1, 60))
    return delay / 2 + jitter() * delay / 2


class Line:
    """Every task ever loaded, by id, and the fair line of those due. Thread-safe
    (a sync task with a timeout runs on a thread of its own and may enqueue)."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.tasks: dict[UUID, TaskRecord] = {}
        self.weights = dict(weights or {})
        self.lock = threading.RLock()
        self._arrivals = itertools.count()
        self._ready: dict[str, list[Entry]] = {}  # per queue, a heap
        self._scheduled: list[tuple[datetime, int, TaskRecord]] = []
        self._given: dict[str, float] = {}  # per queue: the largest start tag given
        self._finish: dict[tuple[str, str], float] = {}  # per (queue, tenant)
        self._slots: dict[str, int] = {}  # per tenant, in order of first sight
        self._parked: list[TaskRecord] = []  # names the app does not register

    def load(self, envelopes: Iterable[TaskEnvelope], now: datetime) -> int:
        """Stores new tasks (an id seen before is ignored); returns how many were new."""
        new = 0
        with self.lock:
            for envelope in envelopes:
                if envelope.id in self.tasks:
                    continue
                record = TaskRecord.of(envelope, next(self._arrivals))
                self.tasks[record.id] = record
                if envelope.eta is not None and envelope.eta > now:
                    self._schedule(record, envelope.eta)
                else:
                    self._enter_line(record)
                new += 1
        return new

    def _schedule(self, record: TaskRecord, run_at: datetime) -> None:
        record.status, record.run_at = "scheduled", run_at
        heapq.heappush(self._scheduled, (run_at, next(self._arrivals), record))

    def _enter_line(self, record: TaskRecord) -> None:
        heap = self._ready.setdefault(record.queue, [])
        clock = heap[0][0] if heap else self._given.get(record.queue, 0.0)
        key = (record.queue, record.tenant)
        start = max(clock, self._finish.get(key, 0.0))
        self._finish[key] = start + record.cost / self.weights.get(record.tenant, 1.0)
        self._given[record.queue] = max(self._given.get(record.queue, 0.0), start)
        slot = self._slots.setdefault(record.tenant, len(self._slots))
        record.status, record.run_at = "pending", None
        heapq.heappush(heap, (start, slot, next(self._arrivals), record))

    def promote(self, now: datetime) -> None:
        """Due scheduled tasks into line, in the order they fell due."""
        with self.lock:
            while self._scheduled and self._scheduled[0][0] <= now:
                self._enter_line(heapq.heappop(self._scheduled)[2])

    def next_due(self) -> datetime | None:
        """When the earliest scheduled task falls due."""
        with self.lock:
            return self._scheduled[0][0] if self._scheduled else None

    def claim(self, now: datetime, known: Container[str]) -> TaskRecord | None:
        """The next task in fair order among those due whose name is `known`;
        it is running from now on, on its next attempt."""
        with self.lock:
            self.promote(now)
            best: list[Entry] | None = None
            for heap in self._ready.values():
                while heap and heap[0][3].name not in known:
                    self._parked.append(heapq.heappop(heap)[3])  # stays pending
                if heap and (best is None or heap[0][:3] < best[0][:3]):
                    best = heap
            if best is None:
                return None
            record = self._most_urgent(best, heapq.heappop(best), known)
            record.status = "running"
            record.attempts += 1
            return record

    def _most_urgent(self, heap: list[Entry], turn: Entry, known: Container[str]) -> TaskRecord:
        """The task that runs at `turn`: its tenant's most urgent waiting
        one, which swaps places with the turn's own task when more urgent."""
        _, slot, _, record = turn
        rival = min(
            (i for i, e in enumerate(heap) if e[1] == slot and e[3].name in known),
            key=lambda i: (-heap[i][3].priority, heap[i][0], heap[i][2]),
            default=None,
        )
        if rival is None or heap[rival][3].priority <= record.priority:
            return record
        urgent = heap[rival]
        heap[rival] = (urgent[0], slot, urgent[2], record)  # the turn's task, at its place
        heapq.heapify(heap)
        return urgent[3]

    def complete(self, record: TaskRecord, result: object, now: datetime) -> Outcome:
        with self.lock:
            record.status, record.result, record.finished_at = "succeeded", result, now
        return "succeeded"

    def fail(self, failure: core.Failure, now: datetime) -> Outcome:
        """rota.fail: retried after the backoff (or at `retry_at`) until the
        last attempt; then, or at once when `final`, dead with its error."""
        with self.lock:
            record = self.tasks[failure.task_id]
            record.error = redact(failure.error)
            record.traceback = None if failure.traceback is None else redact(failure.traceback)
            if failure.final or failure.attempt >= record.max_attempts:
                record.status, record.finished_at = "dead", now
                return "dead"
            delay = backoff_seconds(failure.attempt, record.backoff_base, record.backoff_max)
            self._schedule(record, failure.retry_at or now + timedelta(seconds=delay))
            return "retried"

    def backlogs(self, capacities: Mapping[str, int]) -> dict[str, tuple[int, float]]:
        """{tenant: (capacity, work waiting)}: what rota.tenant_backlog tells producers."""
        with self.lock:
            waiting = dict.fromkeys(capacities, 0.0)
            for record in self.tasks.values():
                if record.tenant in waiting and record.status in UNFINISHED:
                    waiting[record.tenant] += record.cost
        return {tenant: (capacity, waiting[tenant]) for tenant, capacity in capacities.items()}
