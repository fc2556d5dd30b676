"""`rota import PATH`: a Spark batch job that loads files of tasks (a backfill,
an archive migration) with fair sequencing, and reports rejected rows.

Columns: name, tenant (required); queue, args, kwargs, cost, eta, max_attempts,
idempotency_key (optional). In CSV, args and kwargs are JSON text; in Parquet
and JSON lines they may also be arrays and maps. Rows are validated on the
executors with the producer's rules; valid ones are loaded in batches through
the core's bulk SQL, rejected ones written with their reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from rota import db
from rota.envelope import TaskEnvelope, make_envelope, parse_envelope, task_id_for_key
from rota.errors import ValidationError
from rota.loader.store import load_in_chunks
from rota.rules import check_idempotency_key, check_tenant
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


def validate_row(row: dict[str, Any], defaults: dict[str, Any]) -> TaskEnvelope:
    """One imported row to an envelope, or an exception saying why not."""
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
    cost, attempts = row.get("cost"), row.get("max_attempts")
    return make_envelope(
        name=row.get("name"),  # type: ignore[arg-type]
        queue=queue,
        tenant=tenant,
        args=list(args) if isinstance(args, list | tuple) else args,
        kwargs=kwargs,
        task_id=task_id_for_key(check_idempotency_key(key), tenant) if key else None,
        cost=1.0 if cost is None else _number(cost, float),
        max_attempts=defaults["max_attempts"] if attempts is None else _number(attempts, int),
        eta=eta,
        max_payload_bytes=defaults["max_payload_bytes"],
    )


def _validate_partition(rows: Iterable[Any], defaults: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        record = row.asDict(recursive=True)
        try:
            yield (validate_row(record, defaults).to_json().decode(), None, None)
        except Exception as exc:  # any bad row is rejected with its reason, never a crash
            yield (None, _reason(exc), _row_json(record))


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


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
) -> ImportSummary:
    from rota.loader.spark import spark_session

    spark = session or spark_session(master, "rota-import")
    fmt = file_format or FORMATS.get(Path(path.rstrip("/")).suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the format of {path}: pass --format parquet|csv|json")
    reader = spark.read.format(fmt)
    if fmt == "csv":
        # RFC 4180: a quote inside a quoted field is doubled.
        reader = reader.option("header", "true").option("escape", '"')
    frame = reader.load(path)
    defaults = {
        "allowed_queues": settings.allowed_queues,
        "queue": settings.default_queue,
        "max_attempts": settings.default_max_attempts,
        "max_payload_bytes": settings.max_payload_bytes,
    }
    checked = frame.rdd.mapPartitions(lambda rows: _validate_partition(rows, defaults))
    summary = ImportSummary()
    rejected_file = Path(rejected_path or f"{path.rstrip('/')}.rejected.jsonl")
    batch: list[TaskEnvelope] = []
    with db.connect(settings.database_url) as conn, rejected_file.open("w") as rejects:

        def reject(reason: str, row: Any) -> None:
            summary.rejected += 1
            entry = {"reason": reason, "row": row}
            rejects.write(json.dumps(entry) + "\n")
            if len(summary.examples) < 5:
                summary.examples.append(entry)

        def flush() -> None:
            # The loaders' own path: a chunk PostgreSQL refuses is split until
            # the refused rows are found; they are rejected, the rest load.
            loaded, refused = load_in_chunks(conn, batch, settings.loader_batch_size)
            summary.loaded += loaded
            summary.duplicates += len(batch) - loaded - len(refused)
            for envelope, reason in refused:
                reject(reason, orjson.loads(envelope.to_json()))
            batch.clear()

        for envelope_json, reason, raw in checked.toLocalIterator():
            summary.rows += 1
            if reason is not None:
                reject(reason, json.loads(raw))
                continue
            batch.append(parse_envelope(envelope_json, settings.max_payload_bytes))
            if len(batch) >= settings.loader_batch_size:
                flush()
        if batch:
            flush()
    if summary.rejected:
        summary.rejected_path = str(rejected_file)
    else:
        rejected_file.unlink()
    return summary


def summary_dict(summary: ImportSummary) -> dict[str, Any]:
    return asdict(summary)
