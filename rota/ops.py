"""The queue core's operations, each written once for sync and async use.

Every function returns an operation for `rota.db.run` / `rota.db.arun`:

    with psycopg.connect(url, autocommit=True) as conn:
        tasks = db.transact(conn, ops.claim(["pdfs"], limit=100, worker="w1"))
        db.transact(conn, ops.complete([(t.id, t.attempt) for t in tasks]))
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeAlias
from uuid import UUID

import orjson
import psycopg

from rota.db import Copy, Execute, Op, Row, UUIDArray
from rota.envelope import TaskEnvelope
from rota.errors import ValidationError
from rota.rules import check_queue, check_tenant, check_tenant_settings
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


# Column types of the copy_tasks block (rows from `task_rows`). The payload (a
# json column) and the status (an enum) go as text: in binary COPY their form
# is their text, and the text dumper skips psycopg's JSON wrapper (2 µs a task).
TASK_COPY_TYPES = (
    "uuid", "int8", "int4", "int4", "text", "text", "float8", "int4", "float8", "float8",
    "text", "timestamptz", "timestamptz", "text",
)  # fmt: skip
# The copy_ready block: queue_id, vtime, tenant_id, seq, task_id.
READY_COPY_TYPES = ("int4", "float8", "int4", "int8", "uuid")


# A task taking its place in line (`make_ready`): id, seq, queue_id,
# tenant_id, cost. Plain tuples: a loader makes one per task.
ReadyRow: TypeAlias = tuple[UUID, int, int, int, float]


def load(envelopes: Iterable[TaskEnvelope]) -> Op[int]:
    """Bulk-loads tasks with their fair positions: COPY into rota.tasks, then
    their places in line (`make_ready`). Tasks loaded or run before (same id)
    are ignored. Run it in a transaction. Returns how many were new."""
    tasks = _first_of_each_id(envelopes)
    if not tasks:
        return 0
    queues = sorted({t.queue for t in tasks})
    tenants = sorted({t.tenant for t in tasks})
    ((queue_ids, tenant_ids),) = yield Execute(
        query("load_name_ids"), {"queues": queues, "tenants": tenants}
    )
    queue_id = dict(zip(queues, queue_ids, strict=True))
    tenant_id = dict(zip(tenants, tenant_ids, strict=True))
    ((now, seqs, already_ran),) = yield Execute(
        query("load_prepare"), {"count": len(tasks), "ids": UUIDArray(t.id for t in tasks)}
    )
    numbered = _without(list(zip(seqs, tasks, strict=True)), already_ran)

    def copy_tasks(numbered: list[tuple[int, TaskEnvelope]]) -> Copy:
        return Copy(
            query("copy_tasks"), task_rows(numbered, queue_id, tenant_id, now), TASK_COPY_TYPES
        )

    yield Execute(query("load_savepoint"))
    try:
        yield copy_tasks(numbered)
    except psycopg.errors.UniqueViolation:
        # Rare: a batch loaded again (a loader died before acknowledging it).
        # Checking first would cost every batch a probe of the whole table.
        yield Execute(query("load_rollback_to_savepoint"))
        loaded = yield Execute(
            query("existing_tasks"), {"ids": UUIDArray(t.id for _, t in numbered)}
        )
        numbered = _without(numbered, [row[0] for row in loaded])
        yield copy_tasks(numbered)
    later = [(t.eta, t.id) for _, t in numbered if t.eta is not None and t.eta > now]
    if later:
        yield Execute(
            query("schedule_tasks"),
            {
                "run_at": [eta for eta, _ in later],
                "ids": UUIDArray(task_id for _, task_id in later),
            },
        )
    yield from make_ready(
        [
            (t.id, seq, queue_id[t.queue], tenant_id[t.tenant], t.cost)
            for seq, t in numbered
            if t.eta is None or t.eta <= now
        ]
    )
    return len(numbered)


def _first_of_each_id(envelopes: Iterable[TaskEnvelope]) -> list[TaskEnvelope]:
    envelopes = list(envelopes)
    # Keyed by the ids' ints: UUID's own hash is a Python call (1.5 µs a task).
    seen = {envelope.id.int for envelope in envelopes}
    if len(seen) == len(envelopes):
        return envelopes  # the usual case: no id twice
    seen.clear()
    first = []
    for envelope in envelopes:
        if envelope.id.int not in seen:
            seen.add(envelope.id.int)
            first.append(envelope)
    return first


def _without(
    numbered: list[tuple[int, TaskEnvelope]], ids: Sequence[UUID]
) -> list[tuple[int, TaskEnvelope]]:
    if not ids:
        return numbered
    skip = set(ids)
    return [(seq, t) for seq, t in numbered if t.id not in skip]


def task_rows(
    numbered: Iterable[tuple[int, TaskEnvelope]],
    queue_id: dict[str, int],
    tenant_id: dict[str, int],
    now: datetime,
) -> Iterator[tuple[Any, ...]]:
    """The rows of the copy_tasks block (column types TASK_COPY_TYPES)."""
    for seq, t in numbered:
        yield (
            t.id, seq, queue_id[t.queue], tenant_id[t.tenant], t.name, t.payload, t.cost,
            t.max_attempts, t.backoff_base, t.backoff_max,
            "scheduled" if t.eta is not None and t.eta > now else "pending",
            t.eta, t.enqueued_at, t.tenant,
        )  # fmt: skip


def make_ready(tasks: Sequence[ReadyRow]) -> Op[None]:
    """Gives tasks (in arrival order) their fair places in line and makes them
    claimable: start-time fair queueing (docs/architecture.md). Each tenant's next task in
    a queue starts at S = max(V, F), the queue's virtual clock or the tenant's
    finish tag, and moves F on by cost / weight. The queues stay locked until
    the transaction ends, so loaders and schedulers of a queue take turns."""
    if not tasks:
        return
    pairs = sorted({(queue_id, tenant_id) for _, _, queue_id, tenant_id, _ in tasks})
    rows = yield Execute(
        query("fair_starts"),
        {"queue_ids": [q for q, _ in pairs], "tenant_ids": [t for _, t in pairs]},
    )
    start = {(q, t): s for q, t, _, s in rows}
    weight = {(q, t): w for q, t, w, _ in rows}
    last_start: dict[tuple[int, int], float] = {}
    ready = []
    for task_id, seq, queue_id, tenant_id, cost in tasks:
        pair = (queue_id, tenant_id)
        vtime = start[pair]
        ready.append((queue_id, vtime, tenant_id, seq, task_id))
        last_start[pair] = vtime
        start[pair] = vtime + cost / weight[pair]
    yield Copy(query("copy_ready"), ready, READY_COPY_TYPES)
    max_start: dict[int, float] = {}
    for (queue, _), vtime in last_start.items():
        max_start[queue] = max(vtime, max_start.get(queue, vtime))
    yield Execute(
        query("save_fair_tags"),
        {
            "queue_ids": [q for q, _ in last_start],
            "tenant_ids": [t for _, t in last_start],
            "finish_tags": [start[pair] for pair in last_start],
            "clock_queue_ids": list(max_start),
            "max_starts": list(max_start.values()),
        },
    )


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
    ids, attempts = UUIDArray(), []
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
            "ids": UUIDArray(f.task_id for f in failures),
            "attempts": [f.attempt for f in failures],
            # A text column cannot hold NUL, which an exception's message can.
            "errors": [f.error.replace("\x00", "\\x00") for f in failures],
            "retry_at": [f.retry_at for f in failures],
            "final": [f.final for f in failures],
        },
    )
    return [FailOutcome(*row) for row in rows]


def defer_unknown(
    tokens: Iterable[tuple[UUID, int]], delay_seconds: float, grace_seconds: float, reason: str
) -> Op[dict[UUID, str]]:
    """Hands back tasks whose name the worker does not know: run again after
    `delay_seconds` (no attempt used) until unknown for `grace_seconds`, then
    dead with `reason`. Returns {id: 'scheduled' or 'dead'}."""
    rows = yield Execute(
        query("defer_unknown"),
        {**_tokens(tokens), "delay": delay_seconds, "grace": grace_seconds, "reason": reason},
    )
    return {row[0]: row[1] for row in rows}


def worker_claims(worker: str) -> Op[list[tuple[UUID, int]]]:
    """The (task id, attempt) tokens a worker holds now."""
    rows = yield Execute(query("worker_claims"), {"worker": worker})
    return [(row[0], row[1]) for row in rows]


def release(tokens: Iterable[tuple[UUID, int]]) -> Op[set[UUID]]:
    """Hands claimed-but-unstarted tasks back at their place; no attempt is used."""
    rows = yield Execute(query("requeue"), {**_tokens(tokens), "consume": False, "reason": None})
    return {row[0] for row in rows}


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


def extend_leases(tokens: Iterable[tuple[UUID, int]], lease_seconds: float) -> Op[set[UUID]]:
    """Heartbeat: extends the leases; returns the ids still held by these tokens."""
    rows = yield Execute(
        query("extend_leases"), {**_tokens(tokens), "lease_seconds": lease_seconds}
    )
    return {row[0] for row in rows}


def promote_due(limit: int = 10_000) -> Op[int]:
    """Moves due scheduled tasks into line with fresh fair positions."""
    rows = yield Execute(query("take_due"), {"limit": limit})
    yield from make_ready(rows)  # take_due's columns are a ReadyRow's
    return len(rows)


def configure_tenant(
    name: str,
    *,
    weight: float = 1.0,
    concurrency_limit: int | None = None,
    rate_limit: float | None = None,
    rate_burst: float | None = None,
    capacity: int | None = None,
) -> Op[int]:
    """Creates or changes a tenant; returns its slot (id). The name and
    settings are checked when this is called, before any connection is used."""
    check_tenant(name)
    check_tenant_settings(
        weight=weight,
        concurrency_limit=concurrency_limit,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        capacity=capacity,
    )
    return _configure_tenant(
        {
            "name": name,
            "weight": weight,
            "concurrency_limit": concurrency_limit,
            "rate_limit": rate_limit,
            "rate_burst": rate_burst,
            "capacity": capacity,
        }
    )


def _configure_tenant(params: dict[str, Any]) -> Op[int]:
    rows = yield Execute(query("configure_tenant"), params)
    return int(rows[0][0])


def tenant_backlogs() -> Op[dict[str, tuple[int, float]]]:
    """{tenant: (capacity, estimated waiting work)} of the tenants that have a
    capacity, for backpressure."""
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
    rows: list[Row] = yield Execute(query("task_state"), {"ids": UUIDArray(task_ids)})
    return {row[0]: TaskState(*row) for row in rows}


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
    rows = yield Execute(query("stopped_workers_claims"), {"seconds": after_seconds})
    if not rows:
        return set()
    return (yield from requeue_lost([row[0] for row in rows], "its worker stopped holding it"))


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
    ((alive,),) = yield Execute(query("worker_heartbeat"), {"id": worker_id})
    return bool(alive)


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
