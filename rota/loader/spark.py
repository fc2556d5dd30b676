"""The Spark engine: the buffer as a Structured Streaming source, loaded exactly once.

Source: a Python data source (pyspark.sql.datasource) over the buffer's shards,
one partition per shard, offsets being each shard's last stream entry id, kept
in Spark's checkpoint. Each partition's Spark task reads its shard's entries,
checks them, and loads them on its executor in the same Python worker: in
chunks through the core's bulk SQL (COPY + one call), its tenants split into
`ROTA_SPARK_SHARD_CONNECTIONS` groups, each group in one PostgreSQL
transaction of its own on a connection of its own, with a ledger row keyed by
(checkpoint, batch id, part) (rota.loader.spark_load).

Sink: `foreachBatch` runs the micro-batch and settles it. A replayed
micro-batch skips the groups already loaded and loads the rest, so every
task is loaded exactly once. Invalid entries, and tasks PostgreSQL refuses, go to the dead-letter
stream before the commit. Loads of different shards never wait for each
other (a shard holds whole tenants, and loads lock only their tenants' rows),
so the shards load in parallel. Only small records come back to the driver
(per shard: counts, first and last entry id, tenants' costs), never the
rows; the driver then trims each shard through its last entry, and the
source's `commit` trims them again once Spark records the batch. A server
lost by an executor mid-load is reported, not raised: the driver waits the
outage out and runs the batch again in place. A Spark task that fails for
good fails the query, which restarts from its checkpoint. Executors connect
to PostgreSQL and Redis inside each task and close the connections at its end.

    rota loader run                          # local[*]
    rota loader run --master spark://host:7077 --checkpoint s3://bucket/rota
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from rota.buffer import redis_client
from rota.buffer.streams import all_streams, oldest_age
from rota.loader.settle import BufferSettle
from rota.loader.spark_load import EXECUTOR_OUTAGES, LoadJob, ShardResult, TenantCost
from rota.loader.spark_session import SparkOptions
from rota.loader.spark_session import spark_session as build_session
from rota.loader.spark_source import SOURCE_NAME, loading_source
from rota.readmodel.metrics import LoaderMetrics
from rota.runtime.outage import Outage, Polled, run_until_done
from rota.settings import Settings

log = logging.getLogger("rota.loader.spark")


class ShardOutage(Exception):
    """An executor lost a server (or Redis refused a dead letter) while loading
    a shard: that shard's transaction rolled back, the batch is tried again."""


# Tried again in place: a server out or a dead letter Redis refused, met by
# the driver itself or reported by an executor (ShardOutage).
OUTAGES: tuple[type[Exception], ...] = (*EXECUTOR_OUTAGES, ShardOutage)


class BatchSink:
    """foreachBatch: each shard of a micro-batch loaded on its executor,
    exactly once (its ledger row in its own transaction)."""

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
        self._redis: redis_client.Client | None = None
        self.loaded = 0
        self.dead_lettered = 0
        self.batches = 0
        self.outage = Outage("the buffer or PostgreSQL (Spark loader)", log)
        self.settle = BufferSettle(self._buffer, settings)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        """Loads the batch; through an outage of either server, tries again
        in place (the query goes on, the ledger skips the shards loaded)
        until it loads or the loader is stopped."""

        def load() -> bool:
            self._load_batch(frame, batch_id)
            return True

        try:
            done = run_until_done(
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
        self.settle_batch([ShardResult.from_row(row) for row in frame.collect()], batch_id)

    def settle_batch(self, results: list[ShardResult], batch_id: int) -> None:
        """The shards' results: trims and counts what loaded; raises
        ShardOutage if a shard met one (the batch is tried again)."""
        parts = [(r.stream, r.part) for r in results]
        if len(set(parts)) != len(parts):  # a shard split over partitions: never trimmed
            raise RuntimeError(f"micro-batch {batch_id}: a shard in several partitions")
        settled = [r for r in results if r.outage is None]
        failed = [r for r in results if r.outage is not None]
        # Durable now: trimmed here, not only by the source's commit, which
        # Spark calls when the next batch starts (with an idle buffer, never);
        # a shard only once all its groups are loaded. Backlog counts are
        # lowered by the attempt that loaded the group.
        unsettled = {r.stream for r in failed}
        trim = {r.stream: r.last for r in settled if r.last and r.stream not in unsettled}
        loaded = [
            (r.stream, [TenantCost(t, c) for t, c in r.tenants.items()]) for r in settled if r.fresh
        ]
        self.settle.finish(loaded, trim_through=trim)
        stored = sum(r.stored for r in settled)
        dead = sum(r.dead for r in settled)
        tasks = sum(r.tasks for r in settled)
        self.loaded += stored
        self.dead_lettered += dead
        lag = oldest_age(r.first for r in settled if r.first)
        fresh = {r.stream for r in settled if r.fresh}
        if fresh:
            log.info(
                "micro-batch %d: loaded %d task(s), %d dead-lettered, %d shard(s); lag %.3f s",
                batch_id,
                stored,
                dead,
                len(fresh),
                lag,
            )
            if self.metrics is not None:
                self.metrics.passed(stored, tasks - stored, dead, lag)
        if failed:
            raise ShardOutage(f"{failed[0].stream}: {failed[0].outage}")
        self.batches += 1

    def _buffer(self) -> redis_client.Client:
        if self._redis is None:
            # Outages are retried by the batch, in place.
            self._redis = redis_client.connect(self.settings, retries=0)
        return self._redis

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
        self._redis = None


def spark_session(
    master: str = "local[*]", app_name: str = "rota-loader", options: SparkOptions | None = None
) -> SparkSession:
    """A session for the loader (`spark_session.spark_session`)."""
    session: SparkSession = build_session(master, app_name, options)
    return session


def buffer_stream(
    session: SparkSession,
    settings: Settings,
    query_key: str,
    max_entries: int = 0,
    idle_wait: float = 0.0,
) -> DataFrame:
    """The buffer as a stream that loads, each micro-batch's rows the results
    of its shards' loads; with `idle_wait`, a trigger that finds the buffer
    empty waits up to that many seconds for an entry."""
    session.dataSource.register(loading_source(LoadJob(settings, query_key)))
    options = source_options(settings, max_entries, idle_wait)
    return session.readStream.format(SOURCE_NAME).options(**options).load()


def source_options(
    settings: Settings, max_entries: int = 0, idle_wait: float = 0.0
) -> dict[str, str]:
    """The buffer source's options for the loader's settings."""
    return {
        "redis_url": settings.redis_url,
        "redis_timeout": str(settings.redis_timeout),
        "streams": ",".join(all_streams(settings.stream_prefix, settings.shards)),
        "max_payload_bytes": str(settings.max_payload_bytes),
        "queues": ",".join(sorted(settings.allowed_queues or ())),
        "max_entries": str(max_entries),
        "groups": str(settings.spark_shard_connections),
        "idle_wait": str(idle_wait),
    }


def checkpoint_location(checkpoint: str) -> str:
    """Where the query keeps its checkpoint: also its key in the loader ledger."""
    return checkpoint if "://" in checkpoint else str(Path(checkpoint).resolve())


# Seconds between micro-batches: `rota loader run --engine spark`'s default.
TRIGGER_SECONDS = 0.1
# Seconds a trigger that finds the buffer empty waits for an entry.
IDLE_WAIT_SECONDS = 1.0

# Spark's default for a local checkpoint goes through Hadoop's FileContext,
# whose rename asks for the file's link status; without Hadoop's native
# library that forks `readlink`, several times per micro-batch
# (docs/explanation/benchmarks.md). Local renames are atomic through the
# FileSystem API as well.
CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def _checkpoint_manager(spark: SparkSession, checkpoint: str) -> None:
    """A local checkpoint's logs written through the FileSystem API, unless
    the user chose a manager."""
    local = "://" not in checkpoint or checkpoint.startswith("file:")
    if local and spark.conf.get(CHECKPOINT_MANAGER, None) is None:
        spark.conf.set(CHECKPOINT_MANAGER, LOCAL_CHECKPOINT_MANAGER)


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
        # A trigger still getting offsets (an idle one waits there for an
        # entry) has no batch in hand yet: the stop ends it there.
        status = running.status if running.isActive else None
        if not (status and status["isTriggerActive"]) or status["message"].startswith(
            "Getting offsets"
        ):
            break
        time.sleep(0.1)
    if running.isActive:
        running.stop()


def run_streaming(
    settings: Settings,
    *,
    master: str = "local[*]",
    checkpoint: str = "./rota-checkpoints/loader",
    trigger_seconds: float = TRIGGER_SECONDS,
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
    _checkpoint_manager(spark, checkpoint_path)
    sink = BatchSink(settings, query_key=checkpoint_path, should_stop=should_stop, metrics=metrics)
    log.info("Spark loader on %s, checkpoint %s", spark.sparkContext.master, checkpoint_path)
    writer = (
        buffer_stream(
            spark,
            settings,
            checkpoint_path,
            max_entries,
            idle_wait=0.0 if available_now else IDLE_WAIT_SECONDS,
        )
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
            # A Spark task failed for good (an executor's worker lost, the
            # buffer unreachable while read): the query restarts from its
            # checkpoint once the outage passes, and the ledger skips the
            # shards of the replayed batch already loaded.
            if Polled(should_stop, 0.1).wait(sink.outage.failed(RuntimeError(str(failure)))):
                break
    finally:
        sink.close()
    return sink
