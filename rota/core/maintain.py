"""The maintenance duties' operations (rota.consumer.maintenance runs them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from rota.core.db import Execute, Op, UUIDArray
from rota.sql import query


def requeue_lost(task_ids: Sequence[UUID], reason: str) -> Op[set[UUID]]:
    """Requeues tasks whose worker is gone (the attempt counts)."""
    rows = yield Execute(
        query("requeue"),
        {
            "ids": UUIDArray(task_ids),
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


def promote_due(limit: int = 10_000) -> Op[int]:
    """Moves due scheduled tasks into line with fresh fair positions."""
    rows = yield Execute(query("promote_due"), {"limit": limit})
    return int(rows[0][0])


# Rows a retention duty deletes per run: a short transaction, repeated.
PRUNE_BATCH = 10_000


def prune_finished(older_than_seconds: float, limit: int = PRUNE_BATCH) -> Op[int]:
    """Drops up to `limit` records of tasks that succeeded longer ago than this."""
    rows = yield Execute(query("prune_finished"), {"seconds": older_than_seconds, "limit": limit})
    return int(rows[0][0])


def prune_dead(older_than_seconds: float, limit: int = PRUNE_BATCH) -> Op[int]:
    """Drops up to `limit` dead tasks that died longer ago than this."""
    rows = yield Execute(query("prune_dead"), {"seconds": older_than_seconds, "limit": limit})
    return int(rows[0][0])


def archived_before() -> Op[datetime | None]:
    """Everything that ended before this is archived (None: nothing is)."""
    rows = yield Execute(query("archived_before"))
    before: datetime | None = rows[0][0]
    return before


def prune_workers(older_than_seconds: float) -> Op[int]:
    """Drops rows of workers stopped longer ago than this (holding no claim)."""
    rows = yield Execute(query("prune_workers"), {"seconds": older_than_seconds})
    return int(rows[0][0])


def prune_loader_batches(older_than_seconds: float, keep: int) -> Op[int]:
    """Drops Spark ledger rows no replay can need (all but each checkpoint's
    newest `keep`, if older than this)."""
    rows = yield Execute(
        query("prune_loader_batches"), {"seconds": older_than_seconds, "keep": keep}
    )
    return int(rows[0][0])


def reap_stopped_workers_claims(after_seconds: float) -> Op[set[UUID]]:
    """Requeues claims still held by workers stopped more than this long ago."""
    rows = yield Execute(query("reap_stopped_claims"), {"seconds": after_seconds})
    return {row[0] for row in rows}


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    silent_seconds: float


def live_workers() -> Op[list[WorkerInfo]]:
    rows = yield Execute(query("live_workers"))
    return [WorkerInfo(row[0], row[1], row[2], float(row[3])) for row in rows]


def reap_workers(worker_ids: Sequence[str]) -> Op[set[UUID]]:
    """Declares workers dead and requeues their tasks (the attempt counts);
    a worker that beat within two of its heartbeats is left alive."""
    rows = yield Execute(query("reap_workers"), {"ids": list(worker_ids)})
    return {row[0] for row in rows}


def queue_names() -> Op[list[str]]:
    rows = yield Execute(query("queue_names"))
    return [row[0] for row in rows]


def try_maintenance_lock() -> Op[bool]:
    rows = yield Execute(query("maintenance_lock"))
    return bool(rows[0][0])


def count_service() -> Op[int]:
    """Counts what finished since the last count into rota.service (per
    minute, queue and tenant); returns the completions counted."""
    rows = yield Execute(query("count_service"))
    return int(rows[0][0])


def refresh_stats() -> Op[int]:
    """Recounts rota.stats, the console's figures per queue and tenant."""
    rows = yield Execute(query("refresh_stats"))
    return int(rows[0][0])
