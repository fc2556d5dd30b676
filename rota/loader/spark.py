"""The Spark engine: the buffer as a Structured Streaming source, loaded exactly once.

Source: a Python data source (pyspark.sql.datasource) over the buffer's shards,
one partition per shard, offsets being each shard's last stream entry id, kept
in Spark's checkpoint. Entries are decoded and validated on the executors.

Sink: `foreachBatch` streams the micro-batch to the driver partition by
partition (Spark computes the next while the driver loads) and loads it in
chunks with the core's bulk SQL (COPY + one call), all in one transaction with
a ledger row keyed by (checkpoint, batch id): a replayed micro-batch is
skipped, so every task is loaded exactly once. Invalid entries, and tasks
PostgreSQL refuses, go to the dead-letter stream. The driver loads rather
than the executors: loads of one queue take turns on its lock wherever they
run, so more loaders only add per-load overhead (docs/benchmarks.md).
Once a batch is durable, the source's `commit` trims the shards up to it.

    rota loader run                          # local[*]
    rota loader run --master spark://host:7077 --checkpoint s3://bucket/rota
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from rota import core
from rota.buffer import redis_client
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import Rejected, all_streams, entry_key, oldest_age
from rota.core import db
from rota.loader.settle import BufferSettle, DeadLettersRefused
from rota.loader.spark_session import SparkOptions
from rota.loader.spark_session import spark_session as build_session
from rota.loader.spark_source import SOURCE_NAME, BufferSource
from rota.loader.store import load_entries
from rota.model.envelope import TaskEnvelope
from rota.readmodel.metrics import LoaderMetrics
from rota.runtime.outage import Outage, Polled, retrying
from rota.settings import Settings

log = logging.getLogger("rota.loader.spark")


# Tried again in place: a server out, or a dead letter Redis refused.
OUTAGES: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    DeadLettersRefused,
    *redis_client.SERVER_LOST,
)


class BatchSink:
    """foreachBatch: load a micro-batch exactly once (ledger in the same transaction)."""

    def __init__(
        self,
        settings: Settings,
        query_key: str,
        should_stop: Callable[[], bool] = lambda: False,
        metrics: LoaderMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.query_key = query_key
        self.should_stop = should_stop
        self._conn: psycopg.Connection[Any] | None = None
        self._redis: redis_client.Client | None = None
        self.loaded = 0
        self.dead_lettered = 0
        self.batches = 0
        self.outage = Outage("the buffer or PostgreSQL (Spark loader)", log)
        self.settle = BufferSettle(self._buffer, settings)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        """Loads the batch; through an outage of either server, tries again
        in place (the query goes on, the ledger keeps it exactly once) until
        it loads or the loader is stopped."""

        def load() -> bool:
            self._load_batch(frame, batch_id)
            return True

        try:
            done = retrying(
                load, self.outage, OUTAGES, Polled(self.should_stop).wait, lost=self._lost
            )
        except Exception:
            self.close()  # whatever failed, the next attempt starts afresh
            raise
        if done is None and self.outage.last_error is not None:
            raise self.outage.last_error  # stopped during an outage

    def _lost(self, _error: BaseException) -> None:
        self.close()

    def _load_batch(self, frame: DataFrame, batch_id: int) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(
                self.settings.database_url,
                pooled=self.settings.transaction_pooling,
                connect_timeout=self.settings.database_timeout_seconds,
            )
        size = self.settings.spark_load_size
        stored = 0
        dead: list[tuple[str, str, Rejected]] = []
        with self._conn.transaction():
            if not db.run(self._conn, core.record_loader_batch(self.query_key, batch_id)):
                return  # this micro-batch was loaded before (a replay)
            # Row by row, one partition (shard) after the other, longest first,
            # loading as chunks fill up: Spark computes the next partition while
            # the driver loads this one. A tenant lives in one shard, so its
            # tasks still load in enqueue order.
            entries: list[tuple[tuple[str, str], list[TaskEnvelope]]] = []
            loaded: list[tuple[str, list[TaskEnvelope]]] = []
            waiting = 0
            last: dict[str, str] = {}  # each shard's last entry in this batch
            first: dict[str, str] = {}  # and its first
            for stream, entry_id, data, error in frame.toLocalIterator(prefetchPartitions=True):
                if stream not in last or entry_key(entry_id) > entry_key(last[stream]):
                    last[stream] = entry_id
                if stream not in first or entry_key(entry_id) < entry_key(first[stream]):
                    first[stream] = entry_id
                if error is not None:
                    dead.append((stream, entry_id, Rejected(data.encode(), error)))
                    continue
                envelopes = TaskBatch.from_checked_json(data).envelopes()
                entries.append(((stream, entry_id), envelopes))
                loaded.append((stream, envelopes))
                waiting += len(envelopes)
                if waiting >= size:
                    stored += self._load(entries, dead)
                    entries, waiting = [], 0
            stored += self._load(entries, dead)
            db.run(self._conn, core.count_loader_batch(self.query_key, batch_id, stored))
            # Before the commit: a replay may record them twice, never zero times.
            if self.settle.record_dead(dead):
                raise DeadLettersRefused("dead letters refused; the batch is tried again")
        # Durable now: trimmed here, not only by the source's commit, which
        # Spark calls when the next batch starts (with an idle buffer, never).
        self.settle.finish(loaded, trim_through=last)
        self.loaded += stored
        self.dead_lettered += len(dead)
        self.batches += 1
        lag = oldest_age(first.values())
        if last:
            log.info(
                "micro-batch %d: loaded %d task(s), %d dead-lettered; lag %.3f s",
                batch_id,
                stored,
                len(dead),
                lag,
            )
        if self.metrics is not None:
            tasks = sum(len(envelopes) for _, envelopes in loaded)
            self.metrics.passed(stored, tasks - stored, len(dead), lag)

    def _buffer(self) -> redis_client.Client:
        if self._redis is None:
            # Outages are retried by the batch, in place.
            self._redis = redis_client.connect(self.settings, retries=0)
        return self._redis

    def _load(
        self,
        entries: list[tuple[tuple[str, str], list[TaskEnvelope]]],
        dead: list[tuple[str, str, Rejected]],
    ) -> int:
        """Loads the entries' tasks (savepoints in the batch's transaction); the
        tasks PostgreSQL refuses join `dead`, with the entry they came from."""
        assert self._conn is not None
        stored, refused = load_entries(self._conn, entries, self.settings.spark_load_size)
        dead.extend((stream, entry_id, rejected) for (stream, entry_id), rejected in refused)
        return stored

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._redis is not None:
            self._redis.close()
        self._conn = self._redis = None


def spark_session(
    master: str = "local[*]", app_name: str = "rota-loader", options: SparkOptions | None = None
) -> SparkSession:
    """A session (`spark_session.spark_session`) that reads the buffer."""
    session: SparkSession = build_session(master, app_name, options)
    session.dataSource.register(BufferSource)
    return session


def buffer_stream(session: SparkSession, settings: Settings, max_entries: int = 0) -> DataFrame:
    return (
        session.readStream.format(SOURCE_NAME)
        .option("redis_url", settings.redis_url)
        .option("redis_timeout", str(settings.redis_timeout))
        .option("streams", ",".join(all_streams(settings.stream_prefix, settings.shards)))
        .option("max_payload_bytes", str(settings.max_payload_bytes))
        .option("queues", ",".join(sorted(settings.allowed_queues or ())))
        .option("max_entries", str(max_entries))
        .load()
    )


def checkpoint_location(checkpoint: str) -> str:
    """Where the query keeps its checkpoint: also its key in the loader ledger."""
    return checkpoint if "://" in checkpoint else str(Path(checkpoint).resolve())


def _await(running: Any, should_stop: Callable[[], bool]) -> None:
    """Until the query ends or `should_stop()`; then lets the batch in hand
    finish (interrupting a Python foreachBatch mid-way makes Spark log a storm
    of errors) and stops the query."""
    while running.isActive and not should_stop():
        try:
            running.awaitTermination(1)
        except StreamingQueryException:
            break  # the caller reads running.exception()
    for _ in range(600):
        if not (running.isActive and running.status["isTriggerActive"]):
            break
        time.sleep(0.1)
    if running.isActive:
        running.stop()


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
    metrics: LoaderMetrics | None = None,
) -> BatchSink:
    """Runs the streaming loader until `should_stop()` (or, with `available_now`,
    until what is in the buffer now is loaded). Returns the sink's counters."""
    spark = session or spark_session(master)
    checkpoint_path = checkpoint_location(checkpoint)
    sink = BatchSink(settings, query_key=checkpoint_path, should_stop=should_stop, metrics=metrics)
    log.info("Spark loader on %s, checkpoint %s", spark.sparkContext.master, checkpoint_path)
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
    try:
        while True:
            running = writer.start()
            _await(running, should_stop)
            failure = running.exception()
            if failure is None:
                break  # stopped, or (available_now) caught up
            if available_now:
                raise RuntimeError(f"streaming loader failed: {failure}")
            # A server lost or refusing: the query restarts from its
            # checkpoint once the outage passes; the ledger skips any batch
            # already loaded.
            if Polled(should_stop, 0.1).wait(sink.outage.failed(RuntimeError(str(failure)))):
                break
    finally:
        sink.close()
    return sink
