"""`rota import PATH`: a Spark batch job that loads files of tasks (a backfill,
an archive migration) with fair sequencing, and reports rejected rows.

Columns: name, tenant (required); queue, args, kwargs, cost, eta, max_attempts,
idempotency_key, priority (0-9, within the tenant) (optional). In CSV, args
and kwargs are JSON text; in Parquet and JSON lines they may also be arrays
and maps. Rows are validated on the executors with the producer's rules;
valid ones are loaded in batches through the core's bulk SQL, rejected ones
written with their reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from rota.core import connections
from rota.core.load import TaskColumns
from rota.loader.origin import ORIGIN, by_tenant_order, unkeyed_ids, with_origin
from rota.loader.rows import reason_of
from rota.loader.rows import validate_row as validate_row
from rota.loader.spark_progress import reporting
from rota.loader.spark_session import SparkOptions
from rota.loader.store import load_in_chunks
from rota.settings import Settings

FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}


@dataclass
class ImportSummary:
    rows: int = 0
    loaded: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_path: str | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)


# Progress: rows read, tasks loaded, rows rejected, and the file's rows if known.
OnProgress = Callable[[int, int, int, int | None], None]


@dataclass(frozen=True)
class Counters:
    """Accumulators the executors add to, for progress only (a retried Spark
    task adds again); the summary counts from the job's own results."""

    read: Any
    loaded: Any
    rejected: Any

    @classmethod
    def of(cls, spark: Any) -> Counters:
        context = spark.sparkContext
        return cls(context.accumulator(0), context.accumulator(0), context.accumulator(0))


def _import_batches(
    batches: Iterable[Any], job: dict[str, Any], counters: Counters | None = None
) -> Iterator[Any]:
    """On an executor (mapInArrow): checks its Arrow batches of rows a batch
    at a time (rota.loader.columns) and loads the good ones in chunks, each
    its own transaction, in the partition's order; yields each rejected row,
    then its counts, as batches of the outcome's schema. `counters` (Spark
    accumulators) follow the rows read, tasks loaded and rows rejected, for
    progress."""
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    from rota.loader.columns import check_batch, records

    defaults = job["defaults"]
    seen = 0
    counts = [0, 0]  # stored, duplicates
    pending: list[TaskColumns] = []
    rows_in_split: dict[str, int] = {}
    conn: Any = None

    def outcome(kinds: list[str], lines: Sequence[str | None], numbers: list[int]) -> Any:
        none = [0] * len(kinds)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(kinds),
                pa.array(lines, pa.string()),
                pa.array(numbers, pa.int64()),
                pa.array(none, pa.int64()),
                pa.array(none, pa.int64()),
            ],
            names=["kind", "line", "rows", "loaded", "duplicates"],
        )

    def load(tasks: TaskColumns) -> list[str]:
        nonlocal conn
        conn = conn or connections.connect(job["settings"], "load")
        stored, refused = load_in_chunks(conn, tasks, job["chunk"])
        if counters is not None:
            counters.loaded.add(stored)
            counters.rejected.add(len(refused))
        counts[0] += stored
        counts[1] += len(tasks) - stored - len(refused)
        return [
            _rejection(reason, orjson.loads(tasks.envelope(i).to_json())) for i, reason in refused
        ]

    try:
        for batch in batches:
            seen += batch.num_rows
            unkeyed = unkeyed_ids(batch, rows_in_split)
            rows = batch.drop_columns([c for c in ORIGIN if c in batch.schema.names])
            checked = check_batch(rows, defaults, unkeyed, datetime.now(UTC), reason_of)
            if counters is not None:
                counters.read.add(batch.num_rows)
                counters.rejected.add(len(checked.rejected))
            lines: list[str] = []
            if checked.rejected:
                places = [i for i, _ in checked.rejected]
                found = records(rows, np.array(places, dtype=np.int64))
                lines = [
                    _rejection(reason, record)
                    for (_, reason), record in zip(checked.rejected, found, strict=True)
                ]
            pending.append(checked.tasks)
            if sum(map(len, pending)) >= job["chunk"]:
                lines += load(TaskColumns.joined(pending))
                pending = []
            if lines:
                yield outcome(["rejected"] * len(lines), lines, [0] * len(lines))
        if pending:
            lines = load(TaskColumns.joined(pending))
            if lines:
                yield outcome(["rejected"] * len(lines), lines, [0] * len(lines))
    finally:
        if conn is not None:
            conn.close()
    final = outcome(["counts"], [None], [seen])
    yield final.set_column(3, "loaded", pa.array([counts[0]], pa.int64())).set_column(
        4, "duplicates", pa.array([counts[1]], pa.int64())
    )


def _rejection(reason: str, record: dict[str, Any]) -> str:
    """A rejected row's line in the report: the reason, and the row as read."""
    return json.dumps({"reason": reason, "row": json.loads(_row_json(record))})


def _row_json(record: dict[str, Any]) -> str:
    try:
        return json.dumps(record, default=str)
    except (ValueError, RecursionError):  # too deep to echo back whole
        return json.dumps({key: str(value)[:1000] for key, value in record.items()})


def import_tasks(
    settings: Settings,
    path: str,
    *,
    file_format: str | None = None,
    rejected_path: str | None = None,
    master: str = "local[*]",
    session: Any = None,
    options: SparkOptions | None = None,
    by_tenant: bool = False,
    on_progress: OnProgress | None = None,
) -> ImportSummary:
    """Imports a file (or folder) of tasks: each executor validates and loads
    its own partitions, so loading overlaps validation and the driver holds
    no rows; rejected rows are written, by the executors too, as JSON lines
    under `rejected_path` (any URI Spark can write; `<path>.rejected` by
    default). Each partition loads its rows in file order; partitions load
    in parallel, so a tenant whose rows span partitions gets its places in
    the order its chunks commit. `by_tenant` gathers each tenant's rows in
    one partition, in file order, first (`by_tenant_order`: a shuffle and a sort,
    which cost more than they save on two cores). `on_progress` gets the
    rows read, tasks loaded and rows rejected so far, and the file's rows
    where they are known without reading it (Parquet's footers)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from rota.loader.spark_session import spark_session

    spark = session or spark_session(master, "rota-import", options)
    fmt = file_format or FORMATS.get(Path(path.rstrip("/")).suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the format of {path}: pass --format parquet|csv|json")
    reader = spark.read.format(fmt)
    if fmt == "csv":
        # RFC 4180: a quote inside a quoted field is doubled.
        reader = reader.option("header", "true").option("escape", '"')
    frame = with_origin(reader.load(path), fmt)
    job = {
        "settings": settings,
        "chunk": settings.loader_batch_size,
        "defaults": {
            "allowed_queues": settings.allowed_queues,
            "queue": settings.default_queue,
            "max_attempts": settings.default_max_attempts,
            "max_payload_bytes": settings.max_payload_bytes,
        },
    }
    schema = StructType(
        [
            StructField("kind", StringType()),
            StructField("line", StringType()),
            StructField("rows", LongType()),
            StructField("loaded", LongType()),
            StructField("duplicates", LongType()),
        ]
    )
    if by_tenant:
        frame = by_tenant_order(frame, fmt, spark.sparkContext.defaultParallelism)
    counters = Counters.of(spark) if on_progress else None
    outcome = frame.mapInArrow(
        lambda batches: _import_batches(batches, job, counters), schema
    ).persist(StorageLevel.MEMORY_AND_DISK)
    total = reader.load(path).count() if on_progress and fmt == "parquet" else None

    def counted() -> tuple[int, int, int]:
        assert counters is not None
        return (counters.read.value, counters.loaded.value, counters.rejected.value)

    def report(now: tuple[int, int, int]) -> None:
        if on_progress is not None:
            on_progress(*now, total)

    try:
        rejected = (F.col("kind") == "rejected").cast("long")
        with reporting(counted, report if on_progress else None):
            totals: Any = outcome.agg(
                F.sum("rows"), F.sum("loaded"), F.sum("duplicates"), F.sum(rejected)
            ).first()
        rows, loaded, duplicates, refused = (int(total or 0) for total in totals)
        summary = ImportSummary(rows, loaded, duplicates, refused)
        if summary.rejected:
            rejects = outcome.where(F.col("kind") == "rejected").select("line")
            target = rejected_path or f"{path.rstrip('/')}.rejected"
            rejects.coalesce(1).write.mode("overwrite").text(target)
            summary.rejected_path = target
            summary.examples = [json.loads(r.line) for r in rejects.limit(5).collect()]
    finally:
        outcome.unpersist()
    return summary


def summary_dict(summary: ImportSummary) -> dict[str, Any]:
    return asdict(summary)
