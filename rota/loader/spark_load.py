"""The Spark loader's executor side: each shard of a micro-batch loaded in a
PostgreSQL transaction of its own with its ledger row (checkpoint, batch,
shard), dead letters written before the commit, and one small result row per
shard for the driver (rota.loader.spark). Pickled with the batch: plain
values only; connections are made inside each Spark task and closed at its end.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import psycopg

from rota import core
from rota.buffer import redis_client
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import Rejected, entry_key
from rota.core import db
from rota.loader.settle import BufferSettle, Dead, DeadLettersRefused
from rota.loader.store import load_entries
from rota.model.envelope import TaskEnvelope
from rota.settings import Settings

# What an executor reports instead of failing its Spark task: the driver
# retries the batch in place, and the ledger skips the shards done.
EXECUTOR_OUTAGES: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    DeadLettersRefused,
    *redis_client.SERVER_LOST,
)

# One row per shard a partition held: small, whatever the batch's size.
RESULT_SCHEMA = (
    "stream string, part int, fresh boolean, stored long, dead long, tasks long,"
    " first string, last string, tenants string, outage string"
)
_SHARD = re.compile(r"\{(\d+)\}$")


def shard_of(stream: str) -> int:
    """The shard number in a stream's name (`{prefix}:{<shard>}`): the ledger's
    part, stable across replays (Spark's partition indexes are not)."""
    found = _SHARD.search(stream)
    if found is None:
        raise ValueError(f"{stream!r} is not a buffer shard's name")
    return int(found.group(1))


@dataclass(frozen=True)
class ShardLoad:
    """Pickled to the executors with the batch: plain values only."""

    settings: Settings
    query_key: str
    batch_id: int


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
    first: str
    last: str
    tenants: dict[str, float]  # each tenant's summed cost
    outage: str | None


class _Executor:
    """One partition's connections, made when first needed, closed at its end."""

    def __init__(self, job: ShardLoad) -> None:
        self.job = job
        self._conn: psycopg.Connection[Any] | None = None
        self._redis: redis_client.Client | None = None
        self.settle = BufferSettle(self.buffer, job.settings)

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            settings = self.job.settings
            self._conn = db.connect(
                settings.database_url,
                pooled=settings.transaction_pooling,
                connect_timeout=settings.database_timeout_seconds,
            )
        return self._conn

    def buffer(self) -> redis_client.Client:
        if self._redis is None:
            self._redis = redis_client.connect(self.job.settings, retries=0)
        return self._redis

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._redis is not None:
            self._redis.close()
        self._conn = self._redis = None

    def load_shard(self, stream: str, rows: Iterable[tuple[Any, ...]]) -> ShardResult:
        """Loads one shard's rows in one transaction with its ledger row; a
        shard the ledger has already (a replay) is only read for its ids."""
        job = self.job
        part = shard_of(stream)
        size = job.settings.spark_load_size
        first = last = ""
        stored = tasks = 0
        costs: dict[str, float] = {}
        dead: list[Dead] = []
        conn = self.conn
        with conn.transaction():
            fresh = db.run(conn, core.record_loader_batch(job.query_key, job.batch_id, part))
            # One chunk loads (its thread waiting on PostgreSQL) while the next
            # is decoded; the connection is used by one thread at a time.
            with ThreadPoolExecutor(1, thread_name_prefix="rota-load") as loading:
                pending: Future[tuple[int, list[Dead]]] | None = None
                entries: list[tuple[tuple[str, str], list[TaskEnvelope]]] = []
                waiting = 0
                for _, entry_id, data, error in rows:
                    if not first or entry_key(entry_id) < entry_key(first):
                        first = entry_id
                    if not last or entry_key(entry_id) > entry_key(last):
                        last = entry_id
                    if not fresh:
                        continue
                    if error is not None:
                        dead.append((stream, entry_id, Rejected(data.encode(), error)))
                        continue
                    batch = TaskBatch.from_checked_json(data)
                    for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
                        costs[tenant] = costs.get(tenant, 0.0) + cost
                    envelopes = batch.envelopes()
                    entries.append(((stream, entry_id), envelopes))
                    tasks += len(envelopes)
                    waiting += len(envelopes)
                    # In chunks as rows arrive, in order (the previous chunk
                    # done first): a tenant's tasks take their places in line
                    # in the order they were enqueued.
                    if waiting >= size:
                        stored += _settled(pending, dead)
                        pending = loading.submit(self._load, entries)
                        entries, waiting = [], 0
                stored += _settled(pending, dead)
            if fresh:
                stored += _settled(self._load(entries), dead)
                db.run(conn, core.count_loader_batch(job.query_key, job.batch_id, stored, part))
                # Before the commit: a replay may record them twice, never zero times.
                if self.settle.record_dead(dead):
                    raise DeadLettersRefused("dead letters refused; the shard is tried again")
        return ShardResult(stream, fresh, stored, len(dead), tasks, first, last, costs, None)

    def _load(
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


def _rows(batches: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """The source's rows (stream, entry_id, data, error) out of Arrow batches."""
    for batch in batches:
        yield from zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True)


def load_partition(batches: Iterator[Any], job: ShardLoad) -> Iterator[Any]:
    """On an executor (`mapInArrow`): loads each shard the partition holds (the
    source gives one partition per shard, its rows together and in order);
    yields one result row per shard."""
    pa = _pyarrow()
    executor = _Executor(job)
    results: list[ShardResult] = []
    rows = _rows(batches)
    done: set[str] = set()
    try:
        for stream, group in itertools.groupby(rows, key=lambda row: str(row[0])):
            if stream in done:  # it would be skipped by its own ledger row: lost
                raise ValueError(f"the rows of {stream} are not together in the partition")
            done.add(stream)
            try:
                results.append(executor.load_shard(stream, group))
            except EXECUTOR_OUTAGES as exc:
                results.append(ShardResult(stream, False, 0, 0, 0, "", "", {}, repr(exc)))
                executor.close()
                for _ in rows:  # read through: Spark expects the input consumed
                    pass
                break
    finally:
        executor.close()
    yield pa.RecordBatch.from_pylist(
        [
            {
                "stream": r.stream,
                "part": shard_of(r.stream),
                "fresh": r.fresh,
                "stored": r.stored,
                "dead": r.dead,
                "tasks": r.tasks,
                "first": r.first,
                "last": r.last,
                "tenants": orjson.dumps(r.tenants).decode(),
                "outage": r.outage,
            }
            for r in results
        ],
        schema=_result_schema(),
    )


def _pyarrow() -> Any:
    # Imported by name at run time: on the executors, where Spark needs it anyway.
    return importlib.import_module("pyarrow")


@functools.cache
def _result_schema() -> Any:
    pa = _pyarrow()
    return pa.schema(
        [
            ("stream", pa.string()),
            ("part", pa.int32()),
            ("fresh", pa.bool_()),
            ("stored", pa.int64()),
            ("dead", pa.int64()),
            ("tasks", pa.int64()),
            ("first", pa.string()),
            ("last", pa.string()),
            ("tenants", pa.string()),
            ("outage", pa.string()),
        ]
    )
