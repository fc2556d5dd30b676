"""The read model: what operators and scripts see, shared by the CLI, the
console, its HTTP API and the metrics. Figures per queue and tenant come
from rota.stats and rota.service, which maintenance refreshes; a task's own
story is read live."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from rota.core.db import Execute, Op, Row, UUIDArray
from rota.errors import ValidationError
from rota.model.rules import check_queue, check_tenant
from rota.sql import query

# Tasks counted one by one ahead of a ready task at most (an index range
# scan); past this the number is estimated from a sample of about
# AHEAD_SAMPLE_ROWS rows, so the count costs the same at any depth.
AHEAD_CAP = 10_000
AHEAD_SAMPLE_ROWS = 20_000
TASK_STATES = ("ready", "running", "scheduled", "dead", "cancelled")
TENANT_SORTS = ("name", "waiting", "running", "dead", "oldest_wait", "served", "weight")
MAX_PAGE = 1000


@dataclass(frozen=True)
class TaskState:
    id: UUID
    queue: str
    tenant: str
    status: str  # pending, running, scheduled, succeeded, dead or cancelled
    attempts: int
    last_error: str | None
    finished_at: datetime | None


def task_states(task_ids: Sequence[UUID]) -> Op[dict[UUID, TaskState]]:
    rows: list[Row] = yield Execute(query("task_state"), {"ids": UUIDArray(task_ids)})
    return {row[0]: TaskState(*row) for row in rows}


def queue_counts() -> Op[dict[str, dict[str, int]]]:
    """Live counts per queue (a scan of the queue tables: for `rota stats`)."""
    rows = yield Execute(query("queue_counts"))
    return {row[0]: {"ready": row[1], "running": row[2], "scheduled": row[3]} for row in rows}


@dataclass(frozen=True)
class QueueRow:
    name: str
    paused: bool
    waiting: int
    running: int
    scheduled: int
    dead: int
    per_minute: float  # completions, over the last five minutes
    oldest_wait_seconds: float | None
    counted_at: datetime | None  # when maintenance last refreshed the figures


def queues() -> Op[list[QueueRow]]:
    rows = yield Execute(query("overview_queues"))
    return [
        QueueRow(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5]), float(r[6]),
                 _float(r[7]), r[8])
        for r in rows
    ]  # fmt: skip


@dataclass(frozen=True)
class TenantRow:
    name: str
    weight: float
    paused: bool
    waiting: int
    running: int
    concurrency_limit: int | None
    rate_limit: float | None
    tokens: float | None
    capacity: int | None
    scheduled: int
    dead: int
    oldest_wait_seconds: float | None
    served: int  # completions over the last five minutes
    share: float | None  # of all completions then
    fair_share: float | None  # its weight among the tenants with work


@dataclass(frozen=True)
class TenantPage:
    rows: list[TenantRow]
    total: int


def tenants(
    *,
    sort: str = "waiting",
    descending: bool = True,
    prefix: str = "",
    offset: int = 0,
    limit: int = 50,
) -> Op[TenantPage]:
    if sort not in TENANT_SORTS:
        raise ValidationError(f"sort must be one of {', '.join(TENANT_SORTS)}, got {sort!r}")
    _check_page(offset, limit)
    if not isinstance(prefix, str) or len(prefix) > 128:
        raise ValidationError("a tenant name prefix is a string of at most 128 characters")
    return _tenants(
        {
            "sort": sort,
            "descending": descending,
            "prefix": prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_"),
            "offset": offset,
            "limit": limit,
        }
    )


def _tenants(params: dict[str, Any]) -> Op[TenantPage]:
    rows = yield Execute(query("tenant_rows"), params)
    page = [
        TenantRow(r[0], float(r[1]), r[2], int(r[3]), int(r[4]), r[5], _float(r[6]),
                  _float(r[7]), r[8], int(r[9]), int(r[10]), _float(r[11]), int(r[12]),
                  _float(r[13]), _float(r[14]))
        for r in rows
    ]  # fmt: skip
    return TenantPage(page, int(rows[0][15]) if rows else 0)


@dataclass(frozen=True)
class TopTenant:
    name: str
    paused: bool
    waiting: int
    running: int
    dead: int


def top_tenants(limit: int = 10) -> Op[tuple[list[TopTenant], int]]:
    """The tenants with the most tasks waiting, and how many tenants there are."""
    _check_page(0, limit)
    return _top_tenants(limit)


def _top_tenants(limit: int) -> Op[tuple[list[TopTenant], int]]:
    rows = yield Execute(query("top_tenants"), {"limit": limit})
    ((count,),) = yield Execute(query("tenant_count"))
    top = [TopTenant(r[0], r[1], int(r[2]), int(r[3]), int(r[4])) for r in rows]
    return top, int(count)


@dataclass(frozen=True)
class TenantQueue:
    queue: str
    queue_paused: bool
    waiting: int
    running: int
    scheduled: int
    dead: int
    oldest_wait_seconds: float | None


@dataclass(frozen=True)
class TenantDetail:
    name: str
    slot: int
    weight: float
    paused: bool
    concurrency_limit: int | None
    running: int  # against the concurrency limit (kept only while one is set)
    rate_limit: float | None
    rate_burst: float
    tokens: float | None
    capacity: int | None
    backlog: float | None  # estimated waiting work, in cost units
    created_at: datetime
    queues: list[TenantQueue]
    service: list[tuple[datetime, int, float | None]]  # minute, completions, mean wait (s)


def tenant(name: str) -> Op[TenantDetail | None]:
    check_tenant(name)
    return _tenant(name)


def _tenant(name: str) -> Op[TenantDetail | None]:
    rows = yield Execute(query("tenant_detail"), {"name": name})
    if not rows:
        return None
    r = rows[0]
    slot = int(r[1])
    per_queue = yield Execute(query("tenant_queues_stats"), {"tenant_id": slot})
    service = yield Execute(query("tenant_service"), {"tenant_id": slot})
    return TenantDetail(
        r[0], slot, float(r[2]), r[3], r[4], int(r[5]), _float(r[6]), float(r[7]),
        _float(r[8]), r[9], _float(r[10]), r[11],
        [TenantQueue(q[0], q[1], int(q[2]), int(q[3]), int(q[4]), int(q[5]), _float(q[6]))
         for q in per_queue],
        [(m[0], int(m[1]), _float(m[2])) for m in service],
    )  # fmt: skip


@dataclass(frozen=True)
class TaskRow:
    id: UUID
    queue: str
    tenant: str
    name: str
    state: str
    attempts: int
    max_attempts: int
    enqueued_at: datetime
    at: datetime | None  # scheduled: when it runs; ended: when it ended
    last_error: str | None
    traceback: str | None


def tasks(
    state: str,
    *,
    tenant: str | None = None,
    queue: str | None = None,
    limit: int = 50,
) -> Op[list[TaskRow]]:
    """Tasks in one state (ready in line order, running by claim time,
    scheduled by run time, dead and cancelled the most recent first)."""
    if state not in TASK_STATES:
        raise ValidationError(f"state must be one of {', '.join(TASK_STATES)}, got {state!r}")
    if tenant is not None:
        check_tenant(tenant)
    if queue is not None:
        check_queue(queue)
    _check_page(0, limit)
    ids_of = {
        "ready": query("ready_ids"),
        "running": query("running_ids"),
        "scheduled": query("scheduled_ids"),
        "dead": query("dead_ids"),  # by the partial index of dead tasks
        "cancelled": query("cancelled_ids"),
    }
    return _tasks(
        ids_of[state],
        {"state": state, "tenant": tenant, "queue": queue, "limit": limit, "since": None},
    )


def _tasks(ids_statement: str, params: dict[str, Any]) -> Op[list[TaskRow]]:
    ids = yield Execute(ids_statement, params)
    if not ids:
        return []
    rows = yield Execute(query("task_rows"), {"ids": UUIDArray(row[0] for row in ids)})
    return [TaskRow(*row) for row in rows]


@dataclass(frozen=True)
class StoredTask:
    """A task as PostgreSQL has it, with what decides its wait."""

    id: UUID
    queue: str
    tenant: str
    name: str
    payload: str
    status: str
    attempts: int
    max_attempts: int
    cost: float
    eta: datetime | None
    enqueued_at: datetime
    loaded_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    traceback: str | None
    cancel_requested: bool
    worker: str | None  # running: who holds it
    attempt: int | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    run_at: datetime | None  # scheduled: when it falls due
    queue_paused: bool = False
    tenant_paused: bool = False
    concurrency_limit: int | None = None
    tenant_running: int = 0
    rate_limit: float | None = None
    tokens: float | None = None
    capacity: int | None = None
    ahead: int | None = None  # ready: claimable tasks ahead of it in its queue
    ahead_estimated: bool = False  # past AHEAD_CAP: `ahead` is from a sample
    queue_workers: int = 0  # live workers that claim its queue
    history: tuple[tuple[datetime, str, str], ...] = ()  # (when, who, what) from the audit
    started_at: datetime | None = None  # succeeded: when its last attempt started


# The task_story block's columns, in order (it also returns seq, queue and tenant ids).
_STORED_COLUMNS = [f.name for f in dataclasses.fields(StoredTask)][:28]


def stored_task(task_id: UUID) -> Op[StoredTask | None]:
    """A task's whole story in PostgreSQL (None if it is not there)."""
    if not isinstance(task_id, UUID):
        raise ValidationError("a task id is a UUID")
    return _stored_task(task_id)


def _stored_task(task_id: UUID) -> Op[StoredTask | None]:
    history = tuple(
        (row[0], row[1], row[2])
        for row in (yield Execute(query("task_audit"), {"id": str(task_id)}))
    )
    rows = yield Execute(query("task_story"), {"id": task_id})
    if not rows:
        done = yield Execute(query("finished_story"), {"id": task_id})
        if not done:
            return None
        f = done[0]
        return StoredTask(
            f[0], f[1], f[2], "", "", "succeeded", int(f[3]), int(f[3]), 1.0, None, f[4],
            None, f[6], None, None, False, None, None, None, None, None,
            history=history, started_at=f[5],
        )  # fmt: skip
    r = rows[0]
    task = StoredTask(**dict(zip(_STORED_COLUMNS, r, strict=False)), history=history)
    seq, queue_id, tenant_id = r[28], r[29], r[30]
    (workers,) = (yield Execute(query("queue_workers"), {"queue": task.queue}))[0]
    ahead, estimated = None, False
    if task.status == "pending" and task.worker is None:
        mine = {"queue_id": queue_id, "tenant_id": tenant_id, "seq": seq}
        place = yield Execute(query("place_in_line"), {**mine, "cap": AHEAD_CAP + 1})
        if place:
            vtime, ahead = place[0][0], int(place[0][1])
        if ahead is not None and ahead > AHEAD_CAP:
            ((rows,),) = yield Execute(query("ready_rows"))
            percent = min(100.0, 100.0 * AHEAD_SAMPLE_ROWS / max(float(rows), 1.0))
            ((scaled,),) = yield Execute(
                query("place_estimate"), {**mine, "vtime": vtime, "percent": percent}
            )
            # At least what was counted: a small sample can undercount.
            ahead, estimated = max(AHEAD_CAP + 1, round(float(scaled))), True
    return dataclasses.replace(
        task, ahead=ahead, ahead_estimated=estimated, queue_workers=int(workers)
    )


@dataclass(frozen=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    silent_seconds: float
    running: int


def workers() -> Op[list[WorkerRow]]:
    rows = yield Execute(query("workers_view"))
    return [
        WorkerRow(r[0], r[1], r[2], list(r[3]), r[4], r[5], float(r[6]), int(r[7])) for r in rows
    ]


@dataclass(frozen=True)
class LoaderBatch:
    checkpoint: str
    batch_id: int
    tasks: int
    loaded_at: datetime


def loader_batches() -> Op[list[LoaderBatch]]:
    """The Spark loaders' last micro-batch, per checkpoint."""
    rows = yield Execute(query("loader_batches"))
    return [LoaderBatch(*row) for row in rows]


@dataclass(frozen=True)
class AuditRow:
    at: datetime
    actor: str
    action: str
    target: str
    count: int
    detail: str


def audit(limit: int = 50) -> Op[list[AuditRow]]:
    _check_page(0, limit)
    return _audit(limit)


def _audit(limit: int) -> Op[list[AuditRow]]:
    rows = yield Execute(query("recent_audit"), {"limit": limit})
    return [AuditRow(*row) for row in rows]


def ping() -> Op[None]:
    """A round trip (readiness)."""
    yield Execute(query("ping"))


def _check_page(offset: Any, limit: Any) -> None:
    if type(offset) is not int or offset < 0:
        raise ValidationError(f"offset must be an integer >= 0, got {offset!r}")
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
