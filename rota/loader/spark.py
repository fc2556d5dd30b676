"""The Spark engine: the buffer as a Structured Streaming source, loaded exactly once.

Source: a Python data source (pyspark.sql.datasource) over the buffer's shards,
one partition per shard, offsets being each shard's last stream entry id, kept
in Spark's checkpoint. A row is one buffer entry, as Redis holds it.

Sink: `foreachBatch` hands each partition to an executor, which decodes and
validates its entries and loads them with the core's bulk SQL (COPY + one
call), in one transaction with a ledger row keyed by (checkpoint, batch id,
shard): a replayed part is skipped, so every task is loaded exactly once, and
the shards load in parallel, on as many cores or machines as the cluster has.
Invalid entries and tasks PostgreSQL refuses go to the dead-letter stream.
Once a batch is durable, the source's `commit` trims the shards up to it.

    rota loader run                          # local[*]
    rota loader run --master spark://host:7077 --checkpoint s3://bucket/rota
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from rota import db
from rota.buffer import (
    Rejected,
    all_streams,
    dead_letter_stream,
    decode_entry,
    encode_rejected,
)
from rota.envelope import TaskEnvelope
from rota.loader.engine import load_in_chunks
from rota.settings import Settings
from rota.sql import query

SOURCE_NAME = "rota_buffer"
# One row per buffer entry (up to 256 tasks), its fields as Redis holds them:
# rows, not tasks, are what Spark pays for, and the executor that loads them
# decodes them once.
SCHEMA = "stream string, entry_id string, version binary, tasks binary"
COUNTS_SCHEMA = "loaded long, dead_lettered long"
PAGE = 1000


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _after(entry_id: str) -> str:
    """The smallest stream id greater than `entry_id` (for XTRIM MINID)."""
    ms, seq = _id_key(entry_id)
    return f"{ms}-{seq + 1}"


class BufferSource(DataSource):
    """`spark.readStream.format("rota_buffer")`; options: redis_url, streams,
    max_entries (per micro-batch, 0 for all available)."""

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
        self.streams = options["streams"].split(",")
        self.max_entries = int(options.get("max_entries", "0"))

    def _client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def initialOffset(self) -> dict[str, str]:
        return dict.fromkeys(self.streams, "0-0")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_entries) if self.max_entries else ReadAllAvailable()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        client = self._client()
        try:
            end = dict(start)
            per_stream = (
                max(1, limit.max_rows // len(self.streams))
                if isinstance(limit, ReadMaxRows)
                else None
            )
            for stream in self.streams:
                begin = start.get(stream, "0-0")
                if per_stream is None:
                    last: Any = client.xrevrange(stream, count=1)
                else:
                    page: Any = client.xrange(stream, min=f"({begin}", count=per_stream)
                    last = page[-1:]
                if last:
                    entry_id = last[0][0].decode()
                    if _id_key(entry_id) > _id_key(begin):
                        end[stream] = entry_id
            return end
        finally:
            client.close()

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        streams = [s for s in self.streams if end.get(s, "0-0") != start.get(s, "0-0")]
        # Longest shards first: one tenant's backlog makes its shard the batch's
        # longest task, and started last it would finish alone.
        client = self._client()
        try:
            pipe = client.pipeline(transaction=False)
            for stream in streams:
                pipe.xlen(stream)
            lengths = dict(zip(streams, pipe.execute(), strict=True))
        finally:
            client.close()
        streams.sort(key=lambda s: -lengths[s])
        return [InputPartition((s, start.get(s, "0-0"), end[s])) for s in streams]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        stream, first, last = partition.value
        client = self._client()
        try:
            cursor = f"({first}"
            while True:
                page: Any = client.xrange(stream, min=cursor, max=last, count=PAGE)
                for entry_id, fields in page:
                    yield (stream, entry_id.decode(), fields.get(b"v"), fields.get(b"tasks"))
                if len(page) < PAGE:
                    return
                cursor = f"({page[-1][0].decode()}"
        finally:
            client.close()

    def commit(self, end: dict[str, str]) -> None:
        """The batch up to `end` is durable in PostgreSQL: trim it off the shards."""
        client = self._client()
        try:
            for stream, entry_id in end.items():
                if entry_id != "0-0":
                    client.xtrim(stream, minid=_after(entry_id), approximate=False)
        finally:
            client.close()


# An executor's Python worker is reused from task to task: it keeps one
# connection per database rather than opening one per partition.
_executor_connections: dict[str, psycopg.Connection[Any]] = {}


def _executor_connection(url: str) -> psycopg.Connection[Any]:
    conn = _executor_connections.get(url)
    if conn is None or conn.closed or conn.broken:
        conn = _executor_connections[url] = db.connect(url)
    return conn


class PartitionLoader:
    """Runs on an executor (`mapInArrow`): loads one partition (a shard's part
    of micro-batch `batch_id`) in one transaction with its ledger row, and
    yields its counts. Picklable: settings only; connections are made where it
    runs."""

    def __init__(self, settings: Settings, query_key: str, batch_id: int) -> None:
        self.settings = settings
        self.query_key = query_key
        self.batch_id = batch_id

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        by_stream: dict[str, list[tuple[str, TaskEnvelope]]] = {}
        dead: list[tuple[str, str, Rejected]] = []
        for batch in batches:
            columns = batch.to_pydict()
            for stream, entry_id, version, tasks in zip(
                columns["stream"],
                columns["entry_id"],
                columns["version"],
                columns["tasks"],
                strict=True,
            ):
                fields = {k: v for k, v in ((b"v", version), (b"tasks", tasks)) if v is not None}
                good, bad = decode_entry(fields, self.settings.max_payload_bytes)
                part = by_stream.setdefault(stream, [])
                part.extend((entry_id, envelope) for envelope in good)
                dead.extend((stream, entry_id, rejected) for rejected in bad)
        stored = 0
        if by_stream:
            stored, dead = self._load(by_stream, dead)
        yield pa.RecordBatch.from_pydict({"loaded": [stored], "dead_lettered": [len(dead)]})

    def _load(
        self,
        by_stream: dict[str, list[tuple[str, TaskEnvelope]]],
        dead: list[tuple[str, str, Rejected]],
    ) -> tuple[int, list[tuple[str, str, Rejected]]]:
        conn = _executor_connection(self.settings.database_url)
        with conn.transaction():
            envelopes: list[TaskEnvelope] = []
            origin: dict[Any, tuple[str, str]] = {}
            for stream, part in by_stream.items():
                first_time = conn.execute(
                    query("record_loader_batch"),
                    {
                        "query": self.query_key,
                        "batch_id": self.batch_id,
                        "stream": stream,
                        "tasks": len(part),
                    },
                ).fetchall()
                if not first_time:  # loaded before: this is a replay
                    dead = [d for d in dead if d[0] != stream]
                    continue
                envelopes.extend(envelope for _, envelope in part)
                origin.update((envelope.id, (stream, entry_id)) for entry_id, envelope in part)
            stored, refused = load_in_chunks(conn, envelopes, self.settings.loader_batch_size)
            dead.extend((*origin[e.id], Rejected(e.to_json(), reason)) for e, reason in refused)
            if dead:  # before the commit: a replay may record them twice, never zero times
                self._dead_letter(dead)
        return stored, dead

    def _dead_letter(self, dead: list[tuple[str, str, Rejected]]) -> None:
        client = redis.Redis.from_url(self.settings.redis_url)
        try:
            pipe = client.pipeline(transaction=False)
            for stream, entry_id, rejected in dead:
                fields = encode_rejected(rejected, stream, entry_id)
                pipe.xadd(dead_letter_stream(self.settings.stream_prefix), fields)  # type: ignore[arg-type]
            pipe.execute()
        finally:
            client.close()


class BatchSink:
    """foreachBatch: each micro-batch's partitions are loaded where they are
    (`PartitionLoader`), in parallel; the driver only adds up their counts."""

    def __init__(self, settings: Settings, query_key: str) -> None:
        self.settings = settings
        self.query_key = query_key
        self.loaded = 0
        self.dead_lettered = 0
        self.batches = 0

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        loader = PartitionLoader(self.settings, self.query_key, batch_id)
        for counts in frame.mapInArrow(loader, COUNTS_SCHEMA).collect():
            self.loaded += counts.loaded
            self.dead_lettered += counts.dead_lettered
        self.batches += 1


def spark_session(master: str = "local[*]", app_name: str = "rota-loader") -> SparkSession:
    # Executors must run this interpreter (it has rota and its dependencies).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.dataSource.register(BufferSource)
    return session


def buffer_stream(session: SparkSession, settings: Settings, max_entries: int = 0) -> DataFrame:
    return (
        session.readStream.format(SOURCE_NAME)
        .option("redis_url", settings.redis_url)
        .option("streams", ",".join(all_streams(settings.stream_prefix, settings.shards)))
        .option("max_entries", str(max_entries))
        .load()
    )


def run_streaming(
    settings: Settings,
    *,
    master: str = "local[*]",
    checkpoint: str = "./rota-checkpoints/loader",
    trigger_seconds: float = 0.5,
    should_stop: Callable[[], bool] = lambda: False,
    available_now: bool = False,
    max_entries: int = 0,
    session: SparkSession | None = None,
) -> BatchSink:
    """Runs the streaming loader until `should_stop()` (or, with `available_now`,
    until what is in the buffer now is loaded). Returns the sink's counters."""
    spark = session or spark_session(master)
    checkpoint_path = checkpoint if "://" in checkpoint else str(Path(checkpoint).resolve())
    sink = BatchSink(settings, query_key=checkpoint_path)
    writer = (
        buffer_stream(spark, settings, max_entries)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint_path)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    )
    running = writer.start()
    try:
        while running.isActive and not should_stop():
            running.awaitTermination(1)
        if running.exception() is not None:
            raise RuntimeError(f"streaming loader failed: {running.exception()}")
    finally:
        # Let the batch in hand finish: interrupting a Python foreachBatch
        # mid-way makes Spark log a storm of errors.
        for _ in range(600):
            if not (running.isActive and running.status["isTriggerActive"]):
                break
            time.sleep(0.1)
        if running.isActive:
            running.stop()
    return sink
