"""One imported row checked with the producer's rules (`validate_row`):
the reference that `rota import`'s column checks (rota.loader.columns)
agree with, row for row."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import orjson

from rota.core.db import UUIDBytesArray
from rota.core.load import TaskColumns
from rota.errors import ValidationError
from rota.model.envelope import TaskEnvelope, make_envelope, task_id_for_key
from rota.model.rules import check_idempotency_key, check_tenant

# A timestamp `eta` column, as the import reads it: microseconds since the epoch.
ETA_MICROS = "_rota_eta_micros"


def json_value(value: Any, default: Any) -> Any:
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
    args = json_value(row.get("args"), [])
    kwargs = json_value(row.get("kwargs"), {})
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


def reason_of(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


def import_columns(
    ids: list[bytes],
    queues: list[str],
    tenants: list[str],
    names: list[str],
    payloads: list[str],
    costs: list[float],
    max_attempts: list[int],
    etas: list[datetime | None],
    priorities: list[int],
    enqueued_at: datetime,
) -> TaskColumns:
    """Imported tasks as a load's columns: they share their enqueue time and
    the default retry policy (a TaskEnvelope's), and name no limit key."""
    n = len(ids)
    return TaskColumns(
        UUIDBytesArray(ids),
        queues,
        tenants,
        names,
        payloads,
        costs,
        max_attempts,
        [1.0] * n,
        [3600.0] * n,
        etas,
        [enqueued_at] * n,
        priorities,
        [None] * n,
    )
