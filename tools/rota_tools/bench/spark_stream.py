"""The Spark loader as `rota bench load --engine spark` runs it: a streaming
query on a checkpoint of its own while a block runs, a backlog that appears
in the buffer at once, the JVM's warm-up, each micro-batch's phases; and
the loader's executor code without Spark, run beside it (the source's own
planning, its partitions loaded by `BufferStreamReader.load` in plain
processes, as many at once as `local[*]` runs its tasks, the batch settled
as the sink does): the gap between the two is what Spark itself costs. And
the floor under the loader's latency (`micro_batch_floor`, described in
docs/explanation/benchmarks.md): the same query reading and loading nothing."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.pool import Pool
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from rota import Settings
from rota.buffer import redis_client
from rota.buffer.streams import all_streams
from rota.loader.spark import CHECKPOINT_MANAGER, LOCAL_CHECKPOINT_MANAGER
from rota_tools.bench.cpu import machine_seconds
from rota_tools.bench.harness import (
    Backlog,
    Conn,
    bench_app,
    fill_buffer,
    p50_p99,
    phase_medians,
    skewed_tenant,
    wait_for,
    warm_pool,
    warm_up,
)
from rota_tools.sql import query

if TYPE_CHECKING:  # pyspark is imported only by the Spark bench
    from rota.loader.spark_load import ShardResult
    from rota.loader.spark_source import BufferStreamReader

# The tasks of each micro-batch a Spark bench runs first, untimed
# (`--spark-warm-up-batches`): the JVM compiles the micro-batch's own paths
# (planning, scheduling, checkpointing) over its first tens of batches,
# whatever their size, and a long-running loader is past that.
WARM_UP_BATCH_TASKS = 2_000


def loader_thread(
    settings: Settings, spark: Any, checkpoint: str, stop: threading.Event
) -> threading.Thread:
    """The streaming loader in a thread (not started), until `stop` is set,
    with `rota loader run`'s trigger."""
    from rota.loader.spark import run_streaming

    kwargs = {"checkpoint": checkpoint, "should_stop": stop.is_set, "session": spark}
    return threading.Thread(target=run_streaming, kwargs={"settings": settings, **kwargs})


def micro_batch_phases() -> Any:
    """A streaming query listener that keeps the phases (latestOffset,
    walCommit, addBatch, commitOffsets, ...) of each micro-batch that read
    something; `medians()` gives each phase's median in ms."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Phases(StreamingQueryListener):
        def __init__(self) -> None:
            self.batches: list[dict[str, int]] = []

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            if event.progress.numInputRows > 0:
                self.batches.append(dict(event.progress.durationMs))

        def medians(self) -> dict[str, float]:
            return phase_medians(self.batches) | {"batches": len(self.batches)}

    return Phases()


@contextlib.contextmanager
def streaming(settings: Settings, spark: Any, checkpoint: str) -> Iterator[str]:
    """A loader query running on `checkpoint` while the block runs; yields
    the checkpoint as resolved once, the key of its ledger rows."""
    from rota.loader.spark import checkpoint_location

    stop = threading.Event()
    checkpoint = checkpoint_location(checkpoint)
    running = loader_thread(settings, spark, checkpoint, stop)
    running.start()
    try:
        yield checkpoint
    finally:
        stop.set()
        running.join()


def micro_batch_tasks(conn: Conn, checkpoint: str) -> list[int]:
    """The tasks each micro-batch of the query stored, in order (its loader ledger)."""
    rows = conn.execute(query("bench_loader_batches"), {"query": checkpoint}).fetchall()
    return [row[0] for row in rows]


def _until_loaded(conn: Conn, checkpoint: str, tasks: int, poll: float, timeout: float) -> None:
    """Until the query's ledger counts `tasks` (it commits with the tasks):
    0.2 ms a poll, where counting ready tasks took 30 ms while a batch's
    uncommitted rows were in the index (PostgreSQL's time, on two cores)."""
    loaded = lambda: sum(micro_batch_tasks(conn, checkpoint)) >= tasks  # noqa: E731
    wait_for(loaded, timeout, what=f"the loader to load {tasks} tasks", poll=poll)


def sustained(
    backlog: Backlog, spark: Any, conn: Conn, checkpoint: str
) -> tuple[float, list[int], float]:
    """The streaming query runs first (its start-up is not the steady rate), then
    the backlog appears in the buffer at once, as it does for the Python engine
    (which starts on a filled buffer): it is enqueued into streams the query
    does not read and renamed onto its shards in one MULTI. The clock runs
    until every task is claimable. Returns the seconds, the micro-batch
    sizes and the machine's CPU seconds meanwhile."""
    settings = backlog.settings
    filling = settings.model_copy(update={"stream_prefix": f"{settings.stream_prefix}-fill"})
    fill_app = bench_app(filling)
    client = redis_client.connect(settings)
    try:
        with streaming(settings, spark, checkpoint) as checkpoint:
            warm_up(backlog.app, conn)
            fill_buffer(fill_app, backlog.tasks, backlog.tenants, backlog.tenant_of)
            # One MULTI on a single Redis; a cluster cannot span slots in one.
            pipe = client.pipeline(transaction=not redis_client.is_cluster_client(client))
            for staged, live in zip(
                all_streams(filling.stream_prefix, filling.shards),
                all_streams(settings.stream_prefix, settings.shards),
                strict=True,
            ):
                if client.exists(staged):  # a shard no tenant of the backlog maps to has none
                    # (The command, not the method: a cluster pipeline refuses `rename`,
                    # whose two keys here share their shard's slot.)
                    pipe.execute_command("RENAME", staged, live)
            cpu = machine_seconds()
            started = time.perf_counter()
            pipe.execute()
            _until_loaded(conn, checkpoint, backlog.tasks + 1, poll=0.02, timeout=600)
            elapsed = time.perf_counter() - started
            cpu = machine_seconds() - cpu
    finally:
        fill_app.close()
        client.close()
    return elapsed, [n for n in micro_batch_tasks(conn, checkpoint) if n > 0], cpu


def warm_jvm(
    backlog: Backlog, spark: Any, conn: Conn, checkpoint: str, batches: int
) -> dict[str, Any]:
    """Runs a loader query over `batches` micro-batches, each waiting for the
    one before to be loaded; their count and seconds."""
    noop = backlog.app.tasks["noop"]
    started = time.perf_counter()
    with streaming(backlog.settings, spark, checkpoint) as checkpoint:
        for batch in range(batches):
            first = batch * WARM_UP_BATCH_TASKS
            backlog.app.enqueue_many(
                [
                    noop.using(tenant=skewed_tenant(k, 1000)).prepare(k, "pad")
                    for k in range(first, first + WARM_UP_BATCH_TASKS)
                ]
            )
            _until_loaded(conn, checkpoint, first + WARM_UP_BATCH_TASKS, poll=0.005, timeout=120)
    loaded = micro_batch_tasks(conn, checkpoint)
    return {
        "micro_batches": len([n for n in loaded if n > 0]),
        "tasks": sum(loaded),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _load_part(
    args: tuple[BufferStreamReader, tuple[str, str, str, int], int],
) -> list[ShardResult]:
    reader, part, batch_id = args
    return reader.load(part, batch_id)


def _import() -> None:
    import rota.loader.spark_source  # noqa: F401


@contextlib.contextmanager
def executor_processes(shards: int) -> Iterator[Pool]:
    """As many processes as `local[*]` runs a micro-batch's tasks at once
    (a core each, one task a shard), started and importing the executor's
    code before any clock: Spark's workers are up and kept between
    micro-batches too."""
    with warm_pool(min(os.cpu_count() or 1, shards), initializer=_import) as pool:
        yield pool


def load_as_one_batch(
    settings: Settings, pool: Pool, query_key: str, batch_id: int
) -> tuple[float, float, int]:
    """Loads everything in the buffer as one micro-batch of `query_key`, the
    executor code's way; returns the seconds until its loads committed (as
    a Spark run is timed to its ledger), the machine's CPU seconds
    meanwhile and the tasks stored. The batch is then settled (trimmed) as
    the sink does."""
    from rota.loader.spark import BatchSink, source_options
    from rota.loader.spark_load import LoadJob
    from rota.loader.spark_source import BufferStreamReader

    reader = BufferStreamReader(source_options(settings), LoadJob(settings, query_key))
    sink = BatchSink(settings, query_key)
    try:
        cpu = machine_seconds()
        started = time.perf_counter()
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        parts = [(reader, part.value, batch_id) for part in reader.partitions(start, end)]
        results = [r for rs in pool.map(_load_part, parts, chunksize=1) for r in rs]
        elapsed, cpu = time.perf_counter() - started, machine_seconds() - cpu
        sink.settle_batch(results, batch_id)
        reader.commit(end)
        return elapsed, cpu, sink.loaded
    finally:
        sink.close()
        reader.stop()


SOURCE = "rota_bench_floor"
# Micro-batches left out at the start: the first covers everything since the
# epoch, and the JVM compiles its paths during the next few.
WARM_UP_BATCHES = 3


class _Reader(DataSourceStreamReader):
    """Offsets are wall-clock times: a batch covers the arrivals between its
    start and end offsets; each partition reports when its executor read."""

    def __init__(self, partitions: int) -> None:
        self.count = partitions

    def initialOffset(self) -> dict[str, float]:
        return {"at": 0.0}

    def latestOffset(self, start: dict[Any, Any], limit: ReadLimit) -> dict[Any, Any]:
        return {"at": time.time()}

    def partitions(self, start: dict[str, float], end: dict[str, float]) -> list[InputPartition]:
        return [InputPartition((start["at"], end["at"])) for _ in range(self.count)]

    def read(self, partition: InputPartition) -> Any:
        start, end = partition.value
        yield (start, end, time.time())

    def commit(self, end: dict[str, float]) -> None:
        pass


class FloorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE

    def schema(self) -> str:
        return "start double, stop double, read_at double"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Reader(int(self.options.get("partitions", "1")))


def micro_batch_floor(
    spark: Any, partitions: int, trigger_seconds: float, seconds: float
) -> dict[str, Any]:
    """Runs the empty query for `seconds`; the latency of arrivals spread 1 ms
    apart over each batch's span to its partitions' reads, and the batches'
    phases (medians, as the loader's are reported)."""
    spark.dataSource.register(FloorSource)
    reads: list[tuple[float, float, float]] = []

    def sink(frame: Any, _batch_id: int) -> None:
        reads.extend((row.start, row.stop, row.read_at) for row in frame.collect())

    with tempfile.TemporaryDirectory(prefix="rota-bench-floor-") as checkpoint:
        if spark.conf.get(CHECKPOINT_MANAGER, None) is None:
            spark.conf.set(CHECKPOINT_MANAGER, LOCAL_CHECKPOINT_MANAGER)  # as the loader's
        query = (
            spark.readStream.format(SOURCE)
            .option("partitions", str(partitions))
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .start()
        )
        try:
            time.sleep(seconds)
        finally:
            query.stop()
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    kept = set(sorted({(start, stop) for start, stop, _ in reads if start > 0})[WARM_UP_BATCHES:])
    # Each partition stands for a shard's arrivals, committed when it was read.
    waits = [
        (read_at - (stop - k / 1000)) * 1000
        for start, stop, read_at in reads
        if (start, stop) in kept
        for k in range(int((stop - start) * 1000))
    ]
    phases = [p["durationMs"] for p in progress[WARM_UP_BATCHES:]]
    if not waits or not phases:
        raise RuntimeError(f"the floor query ran {len(progress)} micro-batch(es) in {seconds} s")
    return {
        "enqueue_to_read_ms": p50_p99(waits, 1),
        "micro_batch_ms": phase_medians(phases),
        "batches": len(phases),
    }
