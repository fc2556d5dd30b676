"""The Spark loader's executor side, run by the buffer source's `read` (one
Spark task per shard, rota.loader.spark_source): the shard's entries, read
and checked once, go to groups of its tenants
(`ROTA_SPARK_SHARD_CONNECTIONS`), each loading in a PostgreSQL transaction of
its own with its ledger row (checkpoint, micro-batch, part), dead letters
written before the commit; the task's output rows are the groups' results,
for the driver (rota.loader.spark). Pickled with the source: plain values
only. Connections are made in the executor's Python worker when first needed
and kept for the next micro-batch (Spark reuses its workers); an outage
closes them.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import zlib
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import orjson
import psycopg

from rota import core
from rota.buffer import redis_client
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import Rejected
from rota.core import connections, db, versions
from rota.loader.settle import BufferSettle, Dead, DeadLettersRefused
from rota.loader.store import load_entries
from rota.runtime.outage import Kept
from rota.runtime.process import tune_gc
from rota.settings import Settings

# What an executor reports instead of failing its Spark task: the driver
# retries the batch in place, and the ledger skips the shards done.
EXECUTOR_OUTAGES: tuple[type[Exception], ...] = (
    *db.SERVER_LOST,
    *redis_client.SERVER_LOST,
    DeadLettersRefused,
)

# One row per group of a shard: small, whatever the batch's size.
RESULT_SCHEMA = (
    "stream string, part int, fresh boolean, stored long, dead long, tasks long,"
    " first string, last string, tenants string, outage string"
)
_SHARD = re.compile(r"\{(\d+)\}$")
# Set by Spark on every task of a streaming micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"

# (entry id, its valid tasks, its rejected parts), in the shard's order.
Entry = tuple[str, TaskBatch, list[Rejected]]


def shard_of(stream: str) -> int:
    """The shard number in a stream's name (`{prefix}:{<shard>}`): with the
    group, the ledger's part, stable across replays (Spark's partition
    indexes are not)."""
    found = _SHARD.search(stream)
    if found is None:
        raise ValueError(f"{stream!r} is not a buffer shard's name")
    return int(found.group(1))


@dataclass(frozen=True)
class LoadJob:
    """What the source's tasks load with: pickled with the source."""

    settings: Settings
    query_key: str  # the checkpoint: the ledger's key with the batch id


def task_batch_id() -> int:
    """The micro-batch the running Spark task belongs to (the ledger's key):
    Spark sets it on the tasks of each micro-batch, replays included."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if value is None:
        raise RuntimeError("the buffer source loads only within a streaming micro-batch")
    return int(value)


class TenantCost(NamedTuple):
    """A tenant's tasks in a loaded shard, summed: what BufferSettle.finish
    subtracts from the capacity-limited tenants' backlog counts."""

    tenant: str
    cost: float


@dataclass(frozen=True)
class ShardResult:
    stream: str
    part: int  # the ledger's part: shard * groups + group
    fresh: bool  # loaded by this attempt (False: the ledger had it)
    stored: int
    dead: int
    tasks: int
    first: str  # the first entry read ("" when none was)
    last: str  # the shard's end offset in this micro-batch
    tenants: dict[str, float]  # each tenant's summed cost
    outage: str | None

    @classmethod
    def unloaded(cls, stream: str, part: int, last: str, outage: str | None) -> ShardResult:
        """A group this attempt did not load: the ledger had it (no outage),
        or an outage stopped it."""
        return cls(stream, part, False, 0, 0, 0, "", last, {}, outage)

    @classmethod
    def from_row(cls, row: Any) -> ShardResult:
        """From the source's output row (RESULT_SCHEMA)."""
        return cls(
            row.stream,
            row.part,
            row.fresh,
            row.stored,
            row.dead,
            row.tasks,
            row.first,
            row.last,
            orjson.loads(row.tenants),
            row.outage,
        )

    def row(self) -> tuple[Any, ...]:
        """The source's output row (RESULT_SCHEMA)."""
        return (
            self.stream,
            self.part,
            self.fresh,
            self.stored,
            self.dead,
            self.tasks,
            self.first,
            self.last,
            orjson.dumps(self.tenants).decode(),
            self.outage,
        )


class ShardLoader:
    """An executor's connections (one per group of a shard's tenants), made
    when first needed and kept between micro-batches; dropped after an outage."""

    def __init__(self, job: LoadJob) -> None:
        self.job = job
        self._conns: list[Kept[psycopg.Connection[Any]]] = []
        self._redis = Kept(lambda: redis_client.connect(job.settings, retries=0))
        self.buffer = self._redis.get
        self.settle = BufferSettle(self.buffer, job.settings)

    def conn(self, group: int) -> Kept[psycopg.Connection[Any]]:
        while len(self._conns) <= group:
            self._conns.append(
                Kept(lambda: versions.ready(connections.connect(self.job.settings, "load")))
            )
        return self._conns[group]

    def close(self) -> None:
        for kept in self._conns:
            kept.drop()
        self._redis.drop()

    def group_of(self, tenant: str, groups: int) -> int:
        """The tenant's group among a shard's `groups`: stable across
        processes, and independent of its shard (crc32 % shards)."""
        return (zlib.crc32(tenant.encode()) // self.job.settings.shards) % groups

    def load(
        self, stream: str, batch_id: int, last: str, entries: Iterable[Entry], groups: int = 1
    ) -> list[ShardResult]:
        """Loads one shard's entries, its tenants split into `groups`, each
        group in a transaction of its own (on a connection and thread of its
        own) with its ledger row, part `shard * groups + group`: a tenant's
        tasks load in one transaction, in enqueue order. A replay loads only
        the groups the ledger lacks, and reads nothing when it has them all.
        An outage is reported in the results (the connections closed), not
        raised."""
        parts = [_Group(self, g, shard_of(stream) * groups + g, batch_id) for g in range(groups)]
        with ThreadPoolExecutor(groups, thread_name_prefix="rota-load") as pool:
            for group in parts:
                group.start(pool)
            first = ""
            reading: BaseException | None = None
            try:
                fresh = [group for group in parts if group.check()]
                if fresh:
                    first = self._route(stream, entries, parts, groups)
            except BaseException as exc:
                for group in parts:
                    group.abort()  # each rolls back, and its thread ends
                if not isinstance(exc, EXECUTOR_OUTAGES):
                    raise
                reading = exc
            else:
                for group in fresh:
                    group.finish()
            results = [group.result(stream, first, last, reading) for group in parts]
        if any(r.outage is not None for r in results):
            self.close()
        return results

    def _route(
        self, stream: str, entries: Iterable[Entry], parts: list[_Group], groups: int
    ) -> str:
        """Sends each entry's tasks to their tenants' groups, in order; the
        entries' invalid parts go with group 0. Returns the first entry's id."""
        first = ""
        size = self.job.settings.spark_load_size
        # This batch's tenants' groups: a lookup a task instead of a hash.
        known: dict[str, int] = {}
        for entry_id, batch, bad in entries:
            first = first or entry_id
            parts[0].dead.extend((stream, entry_id, rejected) for rejected in bad)
            if not batch.tenants:
                continue
            if groups == 1:
                parts[0].add(stream, entry_id, batch, size)
                continue
            for tenant in set(batch.tenants).difference(known):
                known[tenant] = self.group_of(tenant, groups)
            of = list(map(known.__getitem__, batch.tenants))
            if of.count(of[0]) == len(of):
                parts[of[0]].add(stream, entry_id, batch, size)
                continue
            split: list[list[int]] = [[] for _ in parts]
            for place, group in enumerate(of):
                split[group].append(place)
            for group, places in enumerate(split):
                if places:
                    parts[group].add(stream, entry_id, batch.select(places), size)
        return first


_END = object()


class _Aborted(Exception):
    """The shard's entries could not be read: its groups roll back."""


class _Group:
    """One group of a shard's tenants: its transaction runs on a pool thread,
    fed chunks by the reading thread. A chunk goes over once it holds
    `ROTA_SPARK_LOAD_SIZE` tasks and the connection has none waiting, so
    every group loads while the shard is read; while the connection is busy
    the chunk grows, up to four times that, where the reading waits."""

    def __init__(self, loader: ShardLoader, group: int, part: int, batch_id: int) -> None:
        self.loader = loader
        self.group = group
        self.part = part
        self.batch_id = batch_id
        self.dead: list[Dead] = []  # invalid parts of entries (group 0), then refused tasks
        self.costs: dict[str, float] = {}
        self.tasks = 0
        self._chunk: list[tuple[tuple[str, str], TaskBatch]] = []
        self._waiting = 0
        self._inbox: queue.Queue[object] = queue.Queue()
        self._aborted = threading.Event()
        self._ready: Future[bool] = Future()
        self._done: Future[int] | None = None
        self.fresh = False

    def start(self, pool: ThreadPoolExecutor) -> None:
        self._done = pool.submit(self._run)

    def check(self) -> bool:
        """Waits for the group's ledger check: whether this attempt loads it
        (False also after an outage, which `result` reports)."""
        try:
            self.fresh = self._ready.result()
        except EXECUTOR_OUTAGES:
            self.fresh = False
        return self.fresh

    def add(self, stream: str, entry_id: str, batch: TaskBatch, size: int) -> None:
        """One entry's tasks of this group's tenants, in enqueue order."""
        assert self._done is not None
        if not self.fresh or self._done.done():
            return  # loaded by an earlier attempt, or its load met an outage
        costs = self.costs
        for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
            costs[tenant] = costs.get(tenant, 0.0) + cost
        self._chunk.append(((stream, entry_id), batch))
        self.tasks += len(batch)
        self._waiting += len(batch)
        if self._waiting < size:
            return
        if self._waiting >= 4 * size:
            self._wait_for_room()
        if self._inbox.empty():
            self._inbox.put(self._chunk)
            self._chunk, self._waiting = [], 0

    def _wait_for_room(self) -> None:
        """Until the connection has no chunk waiting (or its thread ended)."""
        assert self._done is not None
        while not self._inbox.empty() and not self._done.done():
            time.sleep(0.002)

    def finish(self) -> None:
        """Hands over the last chunk: the group commits once it is loaded."""
        if self._chunk:
            self._inbox.put(self._chunk)
            self._chunk, self._waiting = [], 0
        self._inbox.put(_END)

    def abort(self) -> None:
        """The group rolls back without loading what waits for it."""
        self._aborted.set()
        self._inbox.put(_END)

    def _run(self) -> int:
        try:
            return self._load()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def _load(self) -> int:
        loader, job = self.loader, self.loader.job
        conn = loader.conn(self.group).get()
        stored = 0
        with conn.transaction():
            if not db.run(conn, core.record_loader_batch(job.query_key, self.batch_id, self.part)):
                self._ready.set_result(False)
                return 0
            self._ready.set_result(True)
            while True:
                message = self._inbox.get()
                if self._aborted.is_set():
                    raise _Aborted
                if message is _END:
                    break
                chunk = cast(list[tuple[tuple[str, str], TaskBatch]], message)
                loaded, refused = load_entries(conn, chunk, job.settings.spark_load_size)
                stored += loaded
                self.dead.extend((s, entry_id, rejected) for (s, entry_id), rejected in refused)
            db.run(conn, core.count_loader_batch(job.query_key, self.batch_id, stored, self.part))
            # Before the commit: a replay may record them twice, never zero times.
            if loader.settle.record_dead(self.dead):
                raise DeadLettersRefused("dead letters refused; the shard is tried again")
        return stored

    def result(
        self, stream: str, first: str, last: str, reading: BaseException | None
    ) -> ShardResult:
        """The group's result, once its thread ended."""
        assert self._done is not None
        try:
            stored = self._done.result()
        except _Aborted:
            return ShardResult.unloaded(stream, self.part, last, repr(reading))
        except EXECUTOR_OUTAGES as exc:
            return ShardResult.unloaded(stream, self.part, last, repr(exc))
        if not self._ready.result():
            return ShardResult.unloaded(stream, self.part, last, None)
        dead = len(self.dead)
        return ShardResult(
            stream, self.part, True, stored, dead, self.tasks, first, last, self.costs, None
        )


_kept: ShardLoader | None = None


def shard_loader(job: LoadJob) -> ShardLoader:
    """This Python worker's loader for `job`, kept between micro-batches. A
    worker Spark forks for the loader runs nothing else: its collector is
    tuned for batches as a loader process's is (`tune_gc`) when it first loads."""
    global _kept
    if _kept is None:
        tune_gc()
    elif _kept.job != job:
        _kept.close()
        _kept = None
    if _kept is None:
        _kept = ShardLoader(job)
    return _kept
