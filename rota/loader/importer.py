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

import hashlib
import json
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import psycopg
import uuid_utils

from rota.core import db
from rota.core.load import TaskColumns, load_columns
from rota.loader.rows import ETA_MICROS, reason_of
from rota.loader.rows import validate_row as validate_row
from rota.loader.spark_session import SparkOptions
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


# The columns the import adds to each row: where it came from, so that the
# same row of the same file always gets the same id (and loads once).
_FILE, _POSITION = "_rota_file", "_rota_position"
# Where a row lies, to put a tenant's rows back in file order after they are
# gathered by tenant: its file's path, and (text formats) its count within
# its split.
_PATH, _PLACE = "_rota_path", "_rota_place"
_ORIGIN = (_FILE, _POSITION, _PATH, _PLACE)


def import_task_id(file_identity: str, position: str) -> UUID:
    """An unkeyed imported row's id: its file (path, size, modification
    time) and its place in it. Importing the file again, or retrying a failed
    import, names the same tasks, which PostgreSQL then holds once."""
    name = f"rota-import:{file_identity}:{position}"
    return UUID(bytes=uuid_utils.uuid5(uuid_utils.NAMESPACE_URL, name).bytes)


def _file_identity(path: str, size: int, modified: Any) -> str:
    return hashlib.sha256(f"{path}\n{size}\n{modified}".encode()).hexdigest()[:32]


def _import_batches(batches: Iterable[Any], job: dict[str, Any]) -> Iterator[Any]:
    """On an executor (mapInArrow): checks its Arrow batches of rows a batch
    at a time (rota.loader.columns) and loads the good ones in chunks, each
    its own transaction, in the partition's order; yields each rejected row,
    then its counts, as batches of the outcome's schema."""
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    from rota.loader.columns import check_batch, envelope_of, records

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
        conn = conn or db.connect(job["database_url"], pooled=job["pooled"])
        stored, refused = _load_columns_in_chunks(conn, tasks, job["chunk"])
        counts[0] += stored
        counts[1] += len(tasks.ids) - stored - len(refused)
        return [
            _rejection(reason, orjson.loads(envelope_of(tasks, i).to_json()))
            for i, reason in refused
        ]

    try:
        for batch in batches:
            seen += batch.num_rows
            unkeyed = _unkeyed_ids(batch, rows_in_split)
            rows = batch.drop_columns([c for c in _ORIGIN if c in batch.schema.names])
            checked = check_batch(rows, defaults, unkeyed, datetime.now(UTC), reason_of)
            lines: list[str] = []
            if checked.rejected:
                places = [i for i, _ in checked.rejected]
                found = records(rows, np.array(places, dtype=np.int64))
                lines = [
                    _rejection(reason, record)
                    for (_, reason), record in zip(checked.rejected, found, strict=True)
                ]
            pending.append(checked.tasks)
            if sum(len(p.ids) for p in pending) >= job["chunk"]:
                lines += load(_joined(pending))
                pending = []
            if lines:
                yield outcome(["rejected"] * len(lines), lines, [0] * len(lines))
        if pending:
            lines = load(_joined(pending))
            if lines:
                yield outcome(["rejected"] * len(lines), lines, [0] * len(lines))
    finally:
        if conn is not None:
            conn.close()
    final = outcome(["counts"], [None], [seen])
    yield final.set_column(3, "loaded", pa.array([counts[0]], pa.int64())).set_column(
        4, "duplicates", pa.array([counts[1]], pa.int64())
    )


def _joined(parts: list[TaskColumns]) -> TaskColumns:
    """The tasks of several checked batches, in order, as one."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    fields: dict[str, Any] = {
        f: [v for part in parts for v in getattr(part, f)]
        for f in ("ids", "queues", "tenants", "names", "payloads", "costs", "max_attempts")
    }
    fields["etas"] = [v for part in parts for v in part.etas]
    fields["priorities"] = [v for part in parts for v in part.priorities]
    return first._replace(**fields)


def _unkeyed_ids(batch: Any, rows_in_split: dict[str, int]) -> list[bytes]:
    """Each row's id if it has no idempotency key: `import_task_id` of its
    file and its place there (Parquet: its row index; text: its split's
    start and its count within the split, counted here unless counted before
    the rows were gathered by tenant)."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    files = batch.column(_FILE)
    positions = batch.column(_POSITION)
    if _PLACE in batch.schema.names:
        counted = batch.column(_PLACE).cast(pa.string())
    elif pa.types.is_string(positions.type) or pa.types.is_large_string(positions.type):
        counted = pa.array(_places(batch, rows_in_split)).cast(pa.string())
    else:
        counted = None
    if counted is None:
        positions = positions.cast(pa.string())
    else:
        positions = pc.binary_join_element_wise(positions, counted, "+")
    names = pc.binary_join_element_wise(pa.scalar("rota-import"), files, positions, ":")
    namespace = uuid_utils.NAMESPACE_URL
    uuid5 = uuid_utils.uuid5
    return [uuid5(namespace, name).bytes for name in names.to_pylist()]


def _load_columns_in_chunks(
    conn: psycopg.Connection[Any], tasks: TaskColumns, size: int
) -> tuple[int, list[tuple[int, str]]]:
    """`load_in_chunks` for tasks given column by column: chunks of `size` in
    order, each its own transaction; a chunk the database refuses for its
    data (not for being down) is split until the culprits are found. Returns
    (tasks stored, refused tasks' places in `tasks` with the reason)."""
    stored = 0
    refused: list[tuple[int, str]] = []
    count = len(tasks.ids)
    # In order, first chunk first: a tenant's tasks take their places in line
    # in the order of the file.
    chunks = deque((start, min(start + size, count)) for start in range(0, count, size))
    while chunks:
        start, stop = chunks.popleft()
        try:
            stored += db.transact(conn, load_columns(tasks.part(slice(start, stop))))
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            if stop - start == 1:
                refused.append((start, f"refused by PostgreSQL: {exc}"))
            else:
                half = (start + stop) // 2
                chunks.extendleft([(half, stop), (start, half)])
    return stored, refused


def _rejection(reason: str, record: dict[str, Any]) -> str:
    """A rejected row's line in the report: the reason, and the row as read."""
    return json.dumps({"reason": reason, "row": json.loads(_row_json(record))})


def _row_json(record: dict[str, Any]) -> str:
    try:
        return json.dumps(record, default=str)
    except (ValueError, RecursionError):  # too deep to echo back whole
        return json.dumps({key: str(value)[:1000] for key, value in record.items()})


def _with_origin(frame: Any, fmt: str) -> Any:
    """The file's rows, each with its file's identity and its place in it
    (Parquet: its row index; text formats: its split's start, counted on);
    a timestamp `eta` as microseconds since the epoch (an instant, whatever
    the executors' time zone)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    identity = F.sha2(
        F.concat_ws(
            "\n",
            F.col("_metadata.file_path"),
            F.col("_metadata.file_size").cast("string"),
            F.unix_micros(F.col("_metadata.file_modification_time")).cast("string"),
        ),
        256,
    ).substr(1, 32)
    position = (
        F.col("_metadata.row_index")
        if fmt == "parquet"
        else F.col("_metadata.file_block_start").cast("string")
    )
    columns = [F.col(c) for c in frame.columns]
    kind = frame.schema["eta"].dataType if "eta" in frame.columns else None
    if isinstance(kind, TimestampType | TimestampNTZType):
        eta = F.col("eta")
        if isinstance(kind, TimestampNTZType):
            eta = eta.cast("timestamp")  # zone-less: read in the session's zone, UTC
        columns = [F.col(c) for c in frame.columns if c != "eta"]
        columns.append(F.unix_micros(eta).alias(ETA_MICROS))
    return frame.select(
        *columns,
        identity.alias(_FILE),
        position.alias(_POSITION),
        F.col("_metadata.file_path").alias(_PATH),
    )


def _by_tenant(frame: Any, fmt: str, parallelism: int) -> Any:
    """The rows gathered by tenant, each tenant's in file order: executors
    then load disjoint sets of tenants, whose loads never wait for each
    other's locks (a load locks its tenants' tags), and a tenant's tasks take
    their places in line in the order of the file, at the price of a shuffle
    and a sort. Text formats first count each row's place within its split,
    in read order (its id depends on it)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    if "tenant" not in frame.columns:
        return frame  # every row is refused: no order to keep
    order = [F.col(_PATH), F.col(_POSITION)]
    if fmt != "parquet":
        counted = StructType([*frame.schema.fields, StructField(_PLACE, LongType())])
        frame = frame.mapInArrow(_counted_in_split, counted)
        order = [F.col(_PATH), F.col(_POSITION).cast("long"), F.col(_PLACE)]
    read = frame.rdd.getNumPartitions()
    if read == 1:
        return frame  # one partition: in file order, and alone with its tenants
    return frame.repartition(max(read, parallelism), F.col("tenant")).sortWithinPartitions(*order)


def _counted_in_split(batches: Iterable[Any]) -> Iterator[Any]:
    """Each row of a text file with its place within its split (the split's
    rows are read in order, within one partition)."""
    import pyarrow as pa

    rows_in_split: dict[str, int] = {}
    for batch in batches:
        yield batch.append_column(_PLACE, pa.array(_places(batch, rows_in_split)))


def _places(batch: Any, rows_in_split: dict[str, int]) -> Any:
    """Each row's count within its split (text formats), carried on from the
    partition's earlier batches in `rows_in_split`."""
    import numpy as np
    import pyarrow.compute as pc

    splits = pc.binary_join_element_wise(batch.column(_FILE), batch.column(_POSITION), "@")
    encoded = pc.dictionary_encode(splits)
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    places = np.empty(len(indices), dtype=np.int64)
    for code, split in enumerate(encoded.dictionary.to_pylist()):
        mine = indices == code
        start = rows_in_split.get(split, -1) + 1
        places[mine] = np.arange(start, start + int(mine.sum()))
        rows_in_split[split] = start + int(mine.sum()) - 1
    return places


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
) -> ImportSummary:
    """Imports a file (or folder) of tasks: each executor validates and loads
    its own partitions, so loading overlaps validation and the driver holds
    no rows; rejected rows are written, by the executors too, as JSON lines
    under `rejected_path` (any URI Spark can write; `<path>.rejected` by
    default). Each partition loads its rows in file order; partitions load
    in parallel, so a tenant whose rows span partitions gets its places in
    the order its chunks commit. `by_tenant` gathers each tenant's rows in
    one partition, in file order, first (`_by_tenant`: a shuffle and a sort,
    which cost more than they save on two cores)."""
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
    frame = _with_origin(reader.load(path), fmt)
    job = {
        "database_url": settings.database_url,
        "pooled": settings.transaction_pooling,
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
        frame = _by_tenant(frame, fmt, spark.sparkContext.defaultParallelism)
    outcome = frame.mapInArrow(lambda batches: _import_batches(batches, job), schema).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        rejected = (F.col("kind") == "rejected").cast("long")
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
