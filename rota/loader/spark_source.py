"""The buffer as a Spark Structured Streaming source (a Python data source):
one partition per shard, offsets being each shard's last stream entry id,
kept in Spark's checkpoint. Entries are decoded and validated on the
executors; rota.loader.spark loads what they yield."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import redis
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from rota.buffer import redis_client
from rota.buffer.streams import decode_entry, entry_key, next_entry_id
from rota.settings import Settings

SOURCE_NAME = "rota_buffer"
# One row per buffer entry (up to 256 tasks): `data` holds the entry's valid
# tasks (a TaskBatch's JSON); a rejected part gets a row of its own, with its
# raw data and the reason in `error`. Rows, not tasks, are what Spark pays for.
SCHEMA = "stream string, entry_id string, data string, error string"
PAGE = 1000


class BufferSource(DataSource):
    """`spark.readStream.format("rota_buffer")`; options: redis_url, streams,
    max_payload_bytes, max_entries (per micro-batch, 0 for all available)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return BufferStreamReader(dict(self.options))


class BufferStreamReader(DataSourceStreamReader):
    # Pickled to the executors: only plain options here; clients are made where used.
    def __init__(self, options: dict[str, str]) -> None:
        self.redis_url = options["redis_url"]
        self.redis_timeout = float(options.get("redis_timeout", "0.5"))
        self.streams = options["streams"].split(",")
        self.max_payload_bytes = int(options.get("max_payload_bytes", str(256 * 1024)))
        self.max_entries = int(options.get("max_entries", "0"))
        queues = options.get("queues")
        self.allowed_queues = frozenset(queues.split(",")) if queues else None
        self._driver_client: redis_client.Client | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver_client"] = None  # a client never travels with the pickled reader
        return state

    def _client(self) -> redis_client.Client:
        settings = Settings(redis_url=self.redis_url, redis_timeout=self.redis_timeout)
        return redis_client.connect(settings)

    @contextlib.contextmanager
    def _planning_client(self) -> Iterator[redis_client.Client]:
        """The driver's client for planning (every trigger asks for the latest
        offsets): kept between calls, dropped after an error."""
        if self._driver_client is None:
            self._driver_client = self._client()
        try:
            yield self._driver_client
        except BaseException:
            self._driver_client.close()
            self._driver_client = None
            raise

    def initialOffset(self) -> dict[str, str]:
        return dict.fromkeys(self.streams, "0-0")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_entries) if self.max_entries else ReadAllAvailable()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        with self._planning_client() as client:
            end = dict(start)
            per_stream = (
                max(1, limit.max_rows // len(self.streams))
                if isinstance(limit, ReadMaxRows)
                else None
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
        return [InputPartition((s, start.get(s, "0-0"), end[s])) for s in streams]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        stream, first, last = partition.value
        client = self._client()
        try:
            cursor = f"({first}"
            while True:
                page: Any = client.xrange(stream, min=cursor, max=last, count=PAGE)
                for raw_id, fields in page:
                    entry_id = raw_id.decode()
                    batch, bad = decode_entry(fields, self.max_payload_bytes, self.allowed_queues)
                    if batch:
                        # A valid entry goes to the driver as it is; else its valid part.
                        data = batch.to_json() if bad else fields[b"tasks"]
                        yield (stream, entry_id, data.decode(), None)
                    for rejected in bad:
                        yield (
                            stream,
                            entry_id,
                            rejected.raw.decode(errors="replace"),
                            rejected.reason,
                        )
                if len(page) < PAGE:
                    return
                cursor = f"({page[-1][0].decode()}"
        finally:
            client.close()

    def commit(self, end: dict[str, str]) -> None:
        """The batch up to `end` is durable in PostgreSQL: trim it off the shards."""
        with self._planning_client() as client:
            pipe = client.pipeline(transaction=False)
            for stream, entry_id in end.items():
                if entry_id != "0-0":
                    pipe.xtrim(stream, minid=next_entry_id(entry_id), approximate=False)
            pipe.execute()

    def stop(self) -> None:
        if self._driver_client is not None:
            self._driver_client.close()
            self._driver_client = None
