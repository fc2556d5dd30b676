"""The floor under the Spark loader's latency, measured in the same run: a
streaming query built as the loader's is (a Python data source with one
partition per buffer shard, foreachBatch collecting one row per partition,
the same trigger) whose partitions read and load nothing. A task that
arrives at a uniform moment waits for the next micro-batch's offsets, then
for that batch's executors; with no work done those waits are the least the
loader's enqueue -> committed latency can be on this machine.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from rota.loader.spark import CHECKPOINT_MANAGER, LOCAL_CHECKPOINT_MANAGER
from rota_tools.bench.harness import p50_p99, phase_medians

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
