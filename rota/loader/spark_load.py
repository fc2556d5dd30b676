"""The Spark loader's executor side, run by the buffer source's `read` (one
Spark task per shard, rota.loader.spark_source): the shard's entries, read
and checked once, load in a PostgreSQL transaction of their own with the
ledger row (checkpoint, micro-batch, shard), dead letters written before the
commit; the task's one output row is the shard's result, for the driver
(rota.loader.spark). Pickled with the source: plain values only. Connections
are made in the executor's Python worker when first needed and kept for the
next micro-batch (Spark reuses its workers); an outage closes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import psycopg

from rota import core
from rota.buffer import redis_client
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import Rejected
from rota.core import connections, db
from rota.loader.settle import BufferSettle, Dead, DeadLettersRefused
from rota.loader.store import load_entries
from rota.model.envelope import TaskEnvelope
from rota.runtime.outage import Kept
from rota.settings import Settings

# What an executor reports instead of failing its Spark task: the driver
# retries the batch in place, and the ledger skips the shards done.
EXECUTOR_OUTAGES: tuple[type[Exception], ...] = (
    *db.SERVER_LOST,
    *redis_client.SERVER_LOST,
    DeadLettersRefused,
)

# One row per shard: small, whatever the batch's size.
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
    """The shard number in a stream's name (`{prefix}:{<shard>}`): the ledger's
    part, stable across replays (Spark's partition indexes are not)."""
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
    fresh: bool  # loaded by this attempt (False: the ledger had it)
    stored: int
    dead: int
    tasks: int
    first: str  # the first entry read ("" when none was)
    last: str  # the shard's end offset in this micro-batch
    tenants: dict[str, float]  # each tenant's summed cost
    outage: str | None

    @classmethod
    def from_row(cls, row: Any) -> ShardResult:
        """From the source's output row (RESULT_SCHEMA)."""
        return cls(
            row.stream,
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
            shard_of(self.stream),
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
    """An executor's connections, made when first needed and kept between
    micro-batches; dropped after an outage."""

    def __init__(self, job: LoadJob) -> None:
        self.job = job
        self._conn = Kept(lambda: connections.connect(job.settings, "load"))
        self._redis = Kept(lambda: redis_client.connect(job.settings, retries=0))
        self.buffer = self._redis.get
        self.settle = BufferSettle(self.buffer, job.settings)

    @property
    def conn(self) -> psycopg.Connection[Any]:
        return self._conn.get()

    def close(self) -> None:
        self._conn.drop()
        self._redis.drop()

    def load(self, stream: str, batch_id: int, last: str, entries: Iterable[Entry]) -> ShardResult:
        """Loads one shard's entries in one transaction with its ledger row; a
        shard the ledger has already (a replay) is not read. An outage is
        reported in the result (the connections closed), not raised."""
        try:
            return self._load(stream, batch_id, last, entries)
        except EXECUTOR_OUTAGES as exc:
            self.close()
            return ShardResult(stream, False, 0, 0, 0, "", last, {}, repr(exc))

    def _load(self, stream: str, batch_id: int, last: str, entries: Iterable[Entry]) -> ShardResult:
        job = self.job
        part = shard_of(stream)
        size = job.settings.spark_load_size
        first = ""
        stored = tasks = 0
        costs: dict[str, float] = {}
        dead: list[Dead] = []
        conn = self.conn
        with conn.transaction():
            if not db.run(conn, core.record_loader_batch(job.query_key, batch_id, part)):
                return ShardResult(stream, False, 0, 0, 0, "", last, {}, None)
            # One chunk loads (its thread waiting on PostgreSQL) while the next
            # is read; the connection is used by one thread at a time.
            with ThreadPoolExecutor(1, thread_name_prefix="rota-load") as loading:
                pending: Future[tuple[int, list[Dead]]] | None = None
                chunk: list[tuple[tuple[str, str], list[TaskEnvelope]]] = []
                waiting = 0
                for entry_id, batch, bad in entries:
                    first = first or entry_id
                    dead.extend((stream, entry_id, rejected) for rejected in bad)
                    if not batch.tenants:
                        continue
                    for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
                        costs[tenant] = costs.get(tenant, 0.0) + cost
                    envelopes = batch.envelopes()
                    chunk.append(((stream, entry_id), envelopes))
                    tasks += len(envelopes)
                    waiting += len(envelopes)
                    # In chunks as entries arrive, in order (the previous chunk
                    # done first): a tenant's tasks take their places in line
                    # in the order they were enqueued.
                    if waiting >= size:
                        stored += _settled(pending, dead)
                        pending = loading.submit(self._load_chunk, chunk)
                        chunk, waiting = [], 0
                stored += _settled(pending, dead)
            stored += _settled(self._load_chunk(chunk), dead)
            db.run(conn, core.count_loader_batch(job.query_key, batch_id, stored, part))
            # Before the commit: a replay may record them twice, never zero times.
            if self.settle.record_dead(dead):
                raise DeadLettersRefused("dead letters refused; the shard is tried again")
        return ShardResult(stream, True, stored, len(dead), tasks, first, last, costs, None)

    def _load_chunk(
        self, entries: list[tuple[tuple[str, str], list[TaskEnvelope]]]
    ) -> tuple[int, list[Dead]]:
        """Loads the entries' tasks (savepoints in the shard's transaction):
        the tasks stored, and those PostgreSQL refused with their entry."""
        stored, refused = load_entries(self.conn, entries, self.job.settings.spark_load_size)
        return stored, [(stream, entry_id, rejected) for (stream, entry_id), rejected in refused]


def _settled(
    load: Future[tuple[int, list[Dead]]] | tuple[int, list[Dead]] | None, dead: list[Dead]
) -> int:
    """The tasks a load stored (waiting for it); its refused tasks join `dead`."""
    if load is None:
        return 0
    stored, refused = load.result() if isinstance(load, Future) else load
    dead.extend(refused)
    return stored


_kept: ShardLoader | None = None


def shard_loader(job: LoadJob) -> ShardLoader:
    """This Python worker's loader for `job`, kept between micro-batches."""
    global _kept
    if _kept is None or _kept.job != job:
        if _kept is not None:
            _kept.close()
        _kept = ShardLoader(job)
    return _kept
