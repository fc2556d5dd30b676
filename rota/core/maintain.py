"""The maintenance duties' operations (rota.consumer.maintenance runs them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from rota.core.db import Op, UUIDArray, select, value, values
from rota.core.rows import Rows
from rota.sql import query


def requeue_lost(task_ids: Sequence[UUID], reason: str) -> Op[set[UUID]]:
    """Requeues tasks whose worker is gone (the attempt counts)."""
    requeued = yield from values(
        query("requeue"),
        {
            "ids": UUIDArray(task_ids),
            "attempts": [None] * len(task_ids),
            "consume": True,
            "reason": reason,
        },
    )
    return set(requeued)


def requeue_expired() -> Op[set[UUID]]:
    """Requeues tasks whose lease ran out (or dead-letters those out of attempts)."""
    return set((yield from values(query("requeue_expired"))))


def promote_due(limit: int = 10_000) -> Op[int]:
    """Moves due scheduled tasks into line with fresh fair positions."""
    return int((yield from value(query("promote_due"), {"limit": limit})))


# Rows a retention duty deletes per run: a short transaction, repeated.
PRUNE_BATCH = 10_000


def prune_finished(older_than_seconds: float, limit: int = PRUNE_BATCH) -> Op[int]:
    """Drops up to `limit` records of tasks that succeeded longer ago than this."""
    return int(
        (yield from value(query("prune_finished"), {"seconds": older_than_seconds, "limit": limit}))
    )


def prune_dead(older_than_seconds: float, limit: int = PRUNE_BATCH) -> Op[int]:
    """Drops up to `limit` dead tasks that died longer ago than this."""
    return int(
        (yield from value(query("prune_dead"), {"seconds": older_than_seconds, "limit": limit}))
    )


def archived_before() -> Op[datetime | None]:
    """Everything that ended before this is archived (None: nothing is)."""
    before: datetime | None = yield from value(query("archived_before"))
    return before


def prune_workers(older_than_seconds: float) -> Op[int]:
    """Drops rows of workers stopped longer ago than this (holding no claim)."""
    return int((yield from value(query("prune_workers"), {"seconds": older_than_seconds})))


def prune_loader_batches(older_than_seconds: float, keep: int) -> Op[int]:
    """Drops Spark ledger rows no replay can need (all but each checkpoint's
    newest `keep`, if older than this)."""
    return int(
        (
            yield from value(
                query("prune_loader_batches"), {"seconds": older_than_seconds, "keep": keep}
            )
        )
    )


def reap_stopped_workers_claims(after_seconds: float) -> Op[set[UUID]]:
    """Requeues claims still held by workers stopped more than this long ago."""
    return set((yield from values(query("reap_stopped_claims"), {"seconds": after_seconds})))


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    silent_seconds: float


def live_workers() -> Op[list[WorkerInfo]]:
    return select(query("live_workers"), None, _WORKER_INFO)


_WORKER_INFO = Rows(WorkerInfo, silent_seconds=float)


def reap_workers(worker_ids: Sequence[str]) -> Op[set[UUID]]:
    """Declares silent workers dead, requeueing their tasks whose leases
    passed (the attempt counts; the others' leases free them, since a silent
    worker may only be cut off); one that beat within two of its heartbeats
    is left alive."""
    return set((yield from values(query("reap_workers"), {"ids": list(worker_ids)})))


def reap_gone_workers(worker_ids: Sequence[str]) -> Op[set[UUID]]:
    """Declares dead workers whose process is gone, requeueing all their
    tasks; one that beat within two of its heartbeats is left alive."""
    return set((yield from values(query("reap_gone_workers"), {"ids": list(worker_ids)})))


def queue_names() -> Op[list[str]]:
    return values(query("queue_names"))


def try_maintenance_lock() -> Op[bool]:
    return bool((yield from value(query("maintenance_lock"))))


def count_service(at: datetime | None = None) -> Op[int]:
    """Counts what finished since the last count, up to a second before
    `at` (now by default), into rota.service (per minute, queue and
    tenant); returns the completions counted."""
    return int((yield from value(query("count_service"), {"at": at})))


def refresh_stats(at: datetime | None = None) -> Op[int]:
    """Recounts rota.stats, the console's figures per queue and tenant, and
    the history of `at`'s minute (now by default)."""
    return int((yield from value(query("refresh_stats"), {"at": at})))
