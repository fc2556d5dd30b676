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
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import uuid_utils

from rota.core import db
from rota.errors import ValidationError
from rota.loader.spark_session import SparkOptions
from rota.loader.store import load_in_chunks
from rota.model.envelope import TaskEnvelope, make_envelope, task_id_for_key
from rota.model.rules import check_idempotency_key, check_tenant
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


def _json_value(value: Any, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, str):
        return orjson.loads(value)  # depth-limited: deep nesting is an error, not a crash
    if hasattr(value, "asDict"):  # a Spark Row (struct)
        return value.asDict(recursive=True)
    return value


def _number(value: Any, convert: type[float] | type[int]) -> Any:
    """CSV columns are text: "2.5" is a number there (anything else is checked as it is)."""
    return convert(value) if isinstance(value, str) else value


def validate_row(
    row: dict[str, Any], defaults: dict[str, Any], unkeyed_id: UUID | None = None
) -> TaskEnvelope:
    """One imported row to an envelope, or an exception saying why not. A
    row without an idempotency key gets `unkeyed_id` (else a new id)."""
    eta = row.get("eta")
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    tenant = check_tenant(row.get("tenant"))
    key = row.get("idempotency_key")
    args = _json_value(row.get("args"), [])
    kwargs = _json_value(row.get("kwargs"), {})
    queue = row.get("queue") or defaults["queue"]
    allowed = defaults["allowed_queues"]
    if allowed is not None and queue not in allowed:
        raise ValidationError(f"queue {queue!r} is not in ROTA_QUEUES")
    cost, attempts, priority = row.get("cost"), row.get("max_attempts"), row.get("priority")
    return make_envelope(
        name=row.get("name"),  # type: ignore[arg-type]
        queue=queue,
        tenant=tenant,
        args=list(args) if isinstance(args, list | tuple) else args,
        kwargs=kwargs,
        task_id=task_id_for_key(check_idempotency_key(key), tenant) if key else unkeyed_id,
        cost=1.0 if cost is None else _number(cost, float),
        max_attempts=defaults["max_attempts"] if attempts is None else _number(attempts, int),
        eta=eta,
        max_payload_bytes=defaults["max_payload_bytes"],
        priority=0 if priority is None else _number(priority, int),
    )


# The columns the import adds to each row: where it came from, so that the
# same row of the same file always gets the same id (and loads once).
_FILE, _POSITION = "_rota_file", "_rota_position"
_ETA_MICROS = "_rota_eta_micros"


def import_task_id(file_identity: str, position: str) -> UUID:
    """An unkeyed imported row's id: its file (path, size, modification
    time) and its place in it. Importing the file again, or retrying a failed
    import, names the same tasks, which PostgreSQL then holds once."""
    name = f"rota-import:{file_identity}:{position}"
    return UUID(bytes=uuid_utils.uuid5(uuid_utils.NAMESPACE_URL, name).bytes)


def _file_identity(path: str, size: int, modified: Any) -> str:
    return hashlib.sha256(f"{path}\n{size}\n{modified}".encode()).hexdigest()[:32]


def _load_partition(rows: Iterable[Any], job: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """On an executor: validates its rows and loads the good ones in chunks
    (the loaders' own path), yielding each rejected row, then its counts."""
    defaults = job["defaults"]
    seen = 0
    batch: list[TaskEnvelope] = []
    rows_in_split: dict[str, int] = {}  # CSV and JSON lines: place within the file's split
    conn: Any = None
    try:
        for row in rows:
            seen += 1
            record = row.asDict(recursive=True)
            file_identity, position = record.pop(_FILE), record.pop(_POSITION)
            if isinstance(position, str):  # "<split start>": count rows within it
                split = f"{file_identity}@{position}"
                place = rows_in_split[split] = rows_in_split.get(split, -1) + 1
                position = f"{position}+{place}"
            micros = record.pop(_ETA_MICROS, None)
            if micros is not None:
                record["eta"] = datetime.fromtimestamp(micros / 1_000_000, UTC)
            task_id = import_task_id(file_identity, str(position))
            try:
                batch.append(validate_row(record, defaults, task_id))
            except Exception as exc:  # any bad row is rejected with its reason, never a crash
                yield ("rejected", _rejection(_reason(exc), record), 0, 0, 0)
                continue
            if len(batch) >= job["chunk"]:
                conn = conn or db.connect(job["database_url"], pooled=job["pooled"])
                yield from _load(conn, batch, job["chunk"])
                batch = []
        if batch:
            conn = conn or db.connect(job["database_url"], pooled=job["pooled"])
            yield from _load(conn, batch, job["chunk"])
    finally:
        if conn is not None:
            conn.close()
    yield ("counts", None, seen, 0, 0)


def _load(conn: Any, batch: list[TaskEnvelope], chunk: int) -> Iterator[tuple[Any, ...]]:
    """Loads `batch`: a row for each task PostgreSQL refused, then the counts."""
    stored, refused = load_in_chunks(conn, batch, chunk)
    for envelope, reason in refused:
        yield ("rejected", _rejection(reason, orjson.loads(envelope.to_json())), 0, 0, 0)
    yield ("counts", None, 0, stored, len(batch) - stored - len(refused))


def _rejection(reason: str, record: dict[str, Any]) -> str:
    """A rejected row's line in the report: the reason, and the row as read."""
    return json.dumps({"reason": reason, "row": json.loads(_row_json(record))})


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


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
        columns.append(F.unix_micros(eta).alias(_ETA_MICROS))
    return frame.select(*columns, identity.alias(_FILE), position.alias(_POSITION))


def import_tasks(
    settings: Settings,
    path: str,
    *,
    file_format: str | None = None,
    rejected_path: str | None = None,
    master: str = "local[*]",
    session: Any = None,
    options: SparkOptions | None = None,
) -> ImportSummary:
    """Imports a file (or folder) of tasks: each executor validates and loads
    its own partitions, so loading overlaps validation and the driver holds
    no rows; rejected rows are written, by the executors too, as JSON lines
    under `rejected_path` (any URI Spark can write; `<path>.rejected` by
    default)."""
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
    outcome = spark.createDataFrame(
        frame.rdd.mapPartitions(lambda rows: _load_partition(rows, job)), schema
    ).persist(StorageLevel.MEMORY_AND_DISK)
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
