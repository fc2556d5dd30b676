"""The queue core's operations, each written once for sync and async use.

Every function returns an operation for `rota.db.run` / `rota.db.arun`:

    with psycopg.connect(url, autocommit=True) as conn:
        tasks = db.transact(conn, ops.claim(["pdfs"], limit=100, worker="w1"))
        db.transact(conn, ops.complete([(t.id, t.attempt) for t in tasks]))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import orjson

from rota.db import Copy, Execute, Op, Row
from rota.envelope import WEIGHT_RANGE, TaskEnvelope, check_queue, check_tenant
from rota.errors import ValidationError
from rota.sql import query


class ClaimedTask(NamedTuple):
    """A claimed task (a tuple: built 100 at a time on the claim's hot path)."""

    id: UUID
    name: str
    payload: dict[str, Any]
    queue: str
    tenant: str
    attempt: int
    max_attempts: int
    lease_expires_at: datetime
    enqueued_at: datetime

    @property
    def args(self) -> list[Any]:
        return list(self.payload.get("args", []))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.payload.get("kwargs", {}))

    @property
    def token(self) -> tuple[UUID, int]:
        """The fencing token that completes, fails or extends this claim."""
        return (self.id, self.attempt)


@dataclass(frozen=True)
class Failure:
    """A failed attempt: `retry_at` forces the next attempt's time (rota.Retry);
    `final` dead-letters at once (no retry can help, e.g. an unknown task)."""

    task_id: UUID
    attempt: int
    error: str
    retry_at: datetime | None = None
    final: bool = False


@dataclass(frozen=True)
class FailOutcome:
    id: UUID
    status: str  # 'scheduled' (will retry) or 'dead'
    run_at: datetime | None


# Column types of the copy_staging block: the arrival number, then TaskEnvelope.copy_row.
# The payload (a json column) goes as text: json's binary form is its text, and
# the text dumper skips psycopg's JSON wrapper (about 2 µs a task).
STAGING_TYPES = (
    "int4", "uuid", "text", "text", "text", "text", "float8", "int4", "float8", "float8",
    "timestamptz", "timestamptz",
)  # fmt: skip


def load(envelopes: Iterable[TaskEnvelope]) -> Op[int]:
    """Bulk-loads tasks with their fair positions: COPY into staging, then one
    SQL call. Tasks already loaded (same id) are ignored. Returns how many
    were new."""
    yield Execute(query("create_staging"))
    # In a caller's own transaction the staging table may hold an earlier
    # batch of the same transaction (ON COMMIT has not emptied it yet).
    yield Execute(query("clear_staging"))
    yield Copy(
        query("copy_staging"),
        ((i, *e.copy_row()) for i, e in enumerate(envelopes)),
        STAGING_TYPES,
    )
    rows = yield Execute(query("load_staged"))
    return int(rows[0][0])


def claim(
    queues: Sequence[str], limit: int, worker: str, lease_seconds: float = 60.0
) -> Op[list[ClaimedTask]]:
    """Claims up to `limit` ready tasks of `queues` in fair order (SKIP LOCKED)."""
    for queue in queues:
        check_queue(queue)
    if limit < 1:
        raise ValidationError(f"claim limit must be >= 1, got {limit}")
    rows = yield Execute(
        query("claim"),
        {"queues": list(queues), "limit": limit, "worker": worker, "lease_seconds": lease_seconds},
    )
    # The payload comes as text: orjson parses it several times faster than
    # psycopg's default json loader.
    return [ClaimedTask(row[0], row[1], orjson.loads(row[2]), *row[3:]) for row in rows]


def _tokens(tokens: Iterable[tuple[UUID, int]]) -> dict[str, list[Any]]:
    ids, attempts = [], []
    for task_id, attempt in tokens:
        ids.append(task_id)
        attempts.append(attempt)
    return {"ids": ids, "attempts": attempts}


def complete(tokens: Iterable[tuple[UUID, int]]) -> Op[set[UUID]]:
    """Completes claimed tasks; returns the ids completed. A stale token is refused."""
    rows = yield Execute(query("complete"), _tokens(tokens))
    return {row[0] for row in rows}


def fail(failures: Sequence[Failure]) -> Op[list[FailOutcome]]:
    """Fails claimed tasks: retry after backoff (or `retry_at`), or dead after the
    last attempt. Stale tokens are refused (absent from the result)."""
    rows = yield Execute(
        query("fail"),
        {
            "ids": [f.task_id for f in failures],
            "attempts": [f.attempt for f in failures],
            # A text column cannot hold NUL, which an exception's message can.
            "errors": [f.error.replace("\x00", "\\x00") for f in failures],
            "retry_at": [f.retry_at for f in failures],
            "final": [f.final for f in failures],
        },
    )
    return [FailOutcome(*row) for row in rows]


def release(tokens: Iterable[tuple[UUID, int]]) -> Op[set[UUID]]:
    """Hands claimed-but-unstarted tasks back at their place; no attempt is used."""
    rows = yield Execute(query("requeue"), {**_tokens(tokens), "consume": False, "reason": None})
    return {row[0] for row in rows}


def requeue_lost(task_ids: Sequence[UUID], reason: str) -> Op[set[UUID]]:
    """Requeues tasks whose worker is gone (the attempt counts)."""
    rows = yield Execute(
        query("requeue"),
        {
            "ids": list(task_ids),
            "attempts": [None] * len(task_ids),
            "consume": True,
            "reason": reason,
        },
    )
    return {row[0] for row in rows}


def requeue_expired() -> Op[set[UUID]]:
    """Requeues tasks whose lease ran out (or dead-letters those out of attempts)."""
    rows = yield Execute(query("requeue_expired"))
    return {row[0] for row in rows}


def extend_leases(tokens: Iterable[tuple[UUID, int]], lease_seconds: float) -> Op[set[UUID]]:
    """Heartbeat: extends the leases; returns the ids still held by these tokens."""
    rows = yield Execute(
        query("extend_leases"), {**_tokens(tokens), "lease_seconds": lease_seconds}
    )
    return {row[0] for row in rows}


def promote_due(limit: int = 10_000) -> Op[int]:
    """Moves due scheduled tasks into line with fresh fair positions."""
    rows = yield Execute(query("promote_due"), {"limit": limit})
    return int(rows[0][0])


def configure_tenant(
    name: str,
    *,
    weight: float = 1.0,
    concurrency_limit: int | None = None,
    rate_limit: float | None = None,
    rate_burst: float | None = None,
    capacity: int | None = None,
) -> Op[int]:
    """Creates or changes a tenant; returns its slot (id)."""
    check_tenant(name)
    low, high = WEIGHT_RANGE
    if not low <= weight <= high:
        raise ValidationError(f"weight must be from {low:g} to {high:g}, got {weight!r}")
    for field, value in (("concurrency_limit", concurrency_limit), ("capacity", capacity)):
        if value is not None and value < 0:
            raise ValidationError(f"{field} must be >= 0, got {value!r}")
    if rate_limit is not None and not rate_limit > 0:
        raise ValidationError(f"rate_limit must be > 0 tasks per second, got {rate_limit!r}")
    if rate_burst is not None and not rate_burst >= 1:
        raise ValidationError(f"rate_burst must be >= 1, got {rate_burst!r}")
    rows = yield Execute(
        query("configure_tenant"),
        {
            "name": name,
            "weight": weight,
            "concurrency_limit": concurrency_limit,
            "rate_limit": rate_limit,
            "rate_burst": rate_burst,
            "capacity": capacity,
        },
    )
    return int(rows[0][0])


def tenant_backlogs() -> Op[dict[str, tuple[int | None, float]]]:
    """{tenant: (capacity, estimated waiting work)} for backpressure."""
    rows = yield Execute(query("tenant_backlog"))
    return {row[0]: (row[1], float(row[2])) for row in rows}


@dataclass(frozen=True)
class TaskState:
    id: UUID
    queue: str
    tenant: str
    status: str  # pending, running, scheduled, succeeded or dead
    attempts: int
    last_error: str | None
    finished_at: datetime | None


def task_states(task_ids: Sequence[UUID]) -> Op[dict[UUID, TaskState]]:
    rows: list[Row] = yield Execute(query("task_state"), {"ids": list(task_ids)})
    return {row[0]: TaskState(*row) for row in rows}


def prune_finished(older_than_seconds: float) -> Op[int]:
    """Drops records of tasks that succeeded longer ago than this; returns how many."""
    rows = yield Execute(query("prune_finished"), {"seconds": older_than_seconds})
    return int(rows[0][0])


def queue_counts() -> Op[dict[str, dict[str, int]]]:
    rows = yield Execute(query("queue_counts"))
    return {row[0]: {"ready": row[1], "running": row[2], "scheduled": row[3]} for row in rows}


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    silent_seconds: float


def register_worker(
    worker_id: str, host: str, pid: int, queues: Sequence[str], concurrency: int
) -> Op[None]:
    yield Execute(
        query("register_worker"),
        {
            "id": worker_id,
            "host": host,
            "pid": pid,
            "queues": list(queues),
            "concurrency": concurrency,
        },
    )


def worker_heartbeat(worker_id: str) -> Op[bool]:
    """False when the worker was declared dead meanwhile (it must stop)."""
    rows = yield Execute(query("worker_heartbeat"), {"id": worker_id})
    return bool(rows)


def stop_worker(worker_id: str) -> Op[None]:
    yield Execute(query("stop_worker"), {"id": worker_id})


def live_workers() -> Op[list[WorkerInfo]]:
    rows = yield Execute(query("live_workers"))
    return [WorkerInfo(row[0], row[1], row[2], float(row[3])) for row in rows]


def reap_workers(worker_ids: Sequence[str]) -> Op[set[UUID]]:
    """Declares workers dead and requeues their tasks (the attempt counts)."""
    rows = yield Execute(query("reap_workers"), {"ids": list(worker_ids)})
    task_ids = [row[0] for row in rows]
    if not task_ids:
        return set()
    return (yield from requeue_lost(task_ids, "worker died"))


def queue_names() -> Op[list[str]]:
    rows = yield Execute(query("queue_names"))
    return [row[0] for row in rows]


def try_maintenance_lock() -> Op[bool]:
    rows = yield Execute(query("maintenance_lock"))
    return bool(rows[0][0])
