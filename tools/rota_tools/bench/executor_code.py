"""The Spark loader's executor code without Spark: the buffer source's own
planning (`latestOffset`, `partitions`), its partitions loaded by
`BufferStreamReader.load` in plain processes, as many at once as `local[*]`
runs its tasks, and the batch settled by the sink's `settle_batch` and the source's
`commit`. Beside the Spark loader in the same run it shows what Spark itself
costs (its JVM, its workers' plumbing); beside the Python loaders, whether
the executors' Python does more than theirs."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from multiprocessing.pool import Pool
from typing import TYPE_CHECKING

from rota import Settings
from rota_tools.bench.cpu import machine_seconds
from rota_tools.bench.harness import warm_pool

if TYPE_CHECKING:  # pyspark is imported only by the Spark bench
    from rota.loader.spark_load import ShardResult
    from rota.loader.spark_source import BufferStreamReader


def _load_part(
    args: tuple[BufferStreamReader, tuple[str, str, str, int], int],
) -> list[ShardResult]:
    reader, part, batch_id = args
    return reader.load(part, batch_id)


@contextlib.contextmanager
def executor_processes(shards: int) -> Iterator[Pool]:
    """As many processes as `local[*]` runs a micro-batch's tasks at once
    (a core each, one task a shard), started and importing the executor's
    code before any clock: Spark's workers are up and kept between
    micro-batches too."""
    processes = min(os.cpu_count() or 1, shards)
    with warm_pool(processes, initializer=_import) as pool:
        yield pool


def _import() -> None:
    import rota.loader.spark_source  # noqa: F401


def load_as_one_batch(
    settings: Settings, pool: Pool, query_key: str, batch_id: int
) -> tuple[float, float, int]:
    """Loads everything in the buffer as one micro-batch of `query_key`;
    returns the seconds until its loads committed (as a Spark run is timed
    to its ledger), the machine's CPU seconds meanwhile and the tasks
    stored. The batch is then settled (trimmed) as the sink does."""
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
