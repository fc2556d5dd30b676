"""The buffer as a Spark Structured Streaming source that loads (a Python
data source): one partition per shard, offsets being each shard's last
stream entry id, kept in Spark's checkpoint with the number of groups a
shard's tenants load in (so that a replayed batch splits them as it did).
Each partition's Spark task reads its shard's entries, checks them and
loads them on its executor, in the one Python worker
(rota.loader.spark_load): its rows are its groups' results. The source is
made for one loader (`loading_source`): what it loads with travels pickled
with the class, never in its options, which Spark shows in plans and its
UI."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from redis.typing import KeyT, StreamIdT

from rota.buffer import redis_client
from rota.buffer.streams import decode_entry, entry_key, next_entry_id
from rota.loader.spark_load import (
    RESULT_SCHEMA,
    Entry,
    LoadJob,
    ShardResult,
    shard_loader,
    task_batch_id,
)
from rota.settings import Settings

SOURCE_NAME = "rota_buffer"
PAGE = 1000
# The offsets' key for the groups a shard's tenants load in (never a stream's name).
GROUPS = "groups"


class BufferSource(DataSource):
    """`spark.readStream.format("rota_buffer")`; options: redis_url, streams,
    max_payload_bytes, max_entries (per micro-batch, 0 for all available),
    groups (connections loading one shard).
    Loads with its class's `job` (`loading_source`)."""

    job: LoadJob | None = None

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return RESULT_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self.job is None:
            raise RuntimeError("the buffer source loads for a loader: use loading_source()")
        return BufferStreamReader(dict(self.options), self.job)


def loading_source(job: LoadJob) -> type[BufferSource]:
    """The source class for one loader: its job rides along with the class,
    which Spark pickles by value to the planner and the executors."""

    class LoadingBufferSource(BufferSource):
        pass

    LoadingBufferSource.job = job
    return LoadingBufferSource


class BufferStreamReader(DataSourceStreamReader):
    # Pickled to the executors: options and the job; clients are made where used.
    def __init__(self, options: dict[str, str], job: LoadJob) -> None:
        self.job = job
        self.redis_url = options["redis_url"]
        self.redis_timeout = float(options.get("redis_timeout", "0.5"))
        self.streams = options["streams"].split(",")
        self.max_payload_bytes = int(options.get("max_payload_bytes", str(256 * 1024)))
        self.max_entries = int(options.get("max_entries", "0"))
        self.groups = int(options.get("groups", "1"))
        self.idle_wait = float(options.get("idle_wait", "0"))
        queues = options.get("queues")
        self.allowed_queues = frozenset(queues.split(",")) if queues else None
        # The driver's clients, made when first needed: for planning, and
        # for the wait for entries (its socket timeout covers the wait).
        self._driver_clients: dict[bool, redis_client.Client] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver_clients"] = {}  # a client never travels with the pickled reader
        return state

    @contextlib.contextmanager
    def _planning_client(self, waiting: bool = False) -> Iterator[redis_client.Client]:
        """The driver's client for planning (every trigger asks for the latest
        offsets), or with `waiting` the one that waits for entries: kept
        between calls, dropped after an error."""
        client = self._driver_clients.get(waiting)
        if client is None:
            settings = Settings(redis_url=self.redis_url, redis_timeout=self.redis_timeout)
            timeout = self.redis_timeout + self.idle_wait if waiting else None
            client = self._driver_clients[waiting] = redis_client.connect(settings, timeout)
        try:
            yield client
        except BaseException:
            del self._driver_clients[waiting]
            client.close()
            raise

    def initialOffset(self) -> dict[str, str]:
        return {**dict.fromkeys(self.streams, "0-0"), GROUPS: str(self.groups)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_entries) if self.max_entries else ReadAllAvailable()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        """Each shard's last entry (within the limit). When no shard has a new
        one, waits up to `idle_wait` seconds for one first: an idle loader asks
        once a wait instead of once a trigger, and a task enqueued meanwhile
        starts its micro-batch at once (a trigger that took longer than its
        interval is followed by the next without a pause). Not on a cluster,
        whose shards one XREAD cannot span."""
        with self._planning_client() as client:
            end = self._latest(client, start, limit)
            if end != start or self.idle_wait <= 0 or not isinstance(client, redis.Redis):
                return end
        with self._planning_client(waiting=True) as waiter:
            after: dict[KeyT, StreamIdT] = {s: start.get(s, "0-0") for s in self.streams}
            arrived = waiter.xread(after, count=1, block=max(1, round(self.idle_wait * 1000)))
        if not arrived:
            return end
        with self._planning_client() as client:
            return self._latest(client, start, limit)

    def _latest(
        self, client: redis_client.Client, start: dict[str, str], limit: ReadLimit
    ) -> dict[str, str]:
        end = dict(start)
        per_stream = (
            max(1, limit.max_rows // len(self.streams)) if isinstance(limit, ReadMaxRows) else None
        )
        # One snapshot of every shard (a transaction, on one Redis): a
        # writer spreading a batch over the shards is seen whole or not
        # at all. A cluster's shards live on different nodes: read apart.
        pipe = client.pipeline(transaction=isinstance(client, redis.Redis))
        for stream in self.streams:
            begin = start.get(stream, "0-0")
            if per_stream is None:
                pipe.xrevrange(stream, count=1)
            else:
                pipe.xrange(stream, min=f"({begin}", count=per_stream)
        replies: list[Any] = pipe.execute()
        for stream, reply in zip(self.streams, replies, strict=True):
            begin = start.get(stream, "0-0")
            last = reply[:1] if per_stream is None else reply[-1:]
            if last:
                entry_id = last[0][0].decode()
                if entry_key(entry_id) > entry_key(begin):
                    end[stream] = entry_id
                    end[GROUPS] = str(self.groups)  # a new batch splits as now
        return end

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        streams = [s for s in self.streams if end.get(s, "0-0") != start.get(s, "0-0")]
        # Longest shards first: one tenant's backlog makes its shard the batch's
        # longest task, and started last it would finish alone.
        with self._planning_client() as client:
            pipe = client.pipeline(transaction=False)
            for stream in streams:
                pipe.xlen(stream)
            lengths = dict(zip(streams, pipe.execute(), strict=True))
        streams.sort(key=lambda s: -lengths[s])
        # As the batch was planned (a checkpoint written before groups: one).
        groups = int(end.get(GROUPS, "1"))
        return [InputPartition((s, start.get(s, "0-0"), end[s], groups)) for s in streams]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """Loads the partition's shard (an outage is reported in its rows)."""
        for result in self.load(partition.value, task_batch_id()):
            yield result.row()

    def load(self, part: tuple[str, str, str, int], batch_id: int) -> list[ShardResult]:
        """A partition's work, `partitions()`' value: its shard's entries
        after the start offset through the end one, loaded in its groups."""
        stream, first, last, groups = part
        loader = shard_loader(self.job)
        entries = self._entries(loader.buffer, stream, first, last)
        return loader.load(stream, batch_id, last, entries, groups)

    def _entries(
        self, buffer: Callable[[], redis_client.Client], stream: str, first: str, last: str
    ) -> Iterator[Entry]:
        """The shard's entries after `first` through `last`, in order, each
        checked: its valid tasks and its rejected parts."""
        cursor = f"({first}"
        while True:
            page: Any = buffer().xrange(stream, min=cursor, max=last, count=PAGE)
            for raw_id, fields in page:
                batch, bad = decode_entry(fields, self.max_payload_bytes, self.allowed_queues)
                yield raw_id.decode(), batch, bad
            if len(page) < PAGE:
                return
            cursor = f"({page[-1][0].decode()}"

    def commit(self, end: dict[str, str]) -> None:
        """The batch up to `end` is durable in PostgreSQL: trim it off the shards."""
        with self._planning_client() as client:
            pipe = client.pipeline(transaction=False)
            for stream, entry_id in end.items():
                if stream != GROUPS and entry_id != "0-0":
                    pipe.xtrim(stream, minid=next_entry_id(entry_id), approximate=False)
            pipe.execute()

    def stop(self) -> None:
        for client in self._driver_clients.values():
            client.close()
        self._driver_clients.clear()
