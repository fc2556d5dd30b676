"""The read model: what operators and scripts see, shared by the CLI, the
console, its HTTP API and the metrics. Figures per queue and tenant come
from rota.stats and rota.service, which maintenance refreshes; a task's own
story is read live (rota.core.stored)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from rota.core.db import Execute, Op, UUIDArray, first, select, value, values
from rota.core.history import FAIR_MINUTES, fair_shares
from rota.core.paging import check_page
from rota.core.rows import Both, Rows, optional_float
from rota.errors import ValidationError
from rota.model.rules import check_queue, check_tenant
from rota.sql import query

# running and claimed (prefetched): a task's claim, as rota.claims tells them apart.
TASK_STATES = ("ready", "running", "claimed", "scheduled", "dead", "cancelled")
TENANT_SORTS = ("name", "waiting", "running", "dead", "oldest_wait", "served", "weight")


@dataclass(frozen=True)
class TaskState:
    id: UUID
    queue: str
    tenant: str
    status: str  # pending, running, scheduled, succeeded, dead or cancelled
    attempts: int
    last_error: str | None
    finished_at: datetime | None
    priority: int | None  # None once succeeded (its record keeps none)


_STATES = Rows(TaskState)


def task_states(task_ids: Sequence[UUID]) -> Op[dict[UUID, TaskState]]:
    states = yield from select(query("task_state"), {"ids": UUIDArray(task_ids)}, _STATES)
    return {state.id: state for state in states}


class _Counts(NamedTuple):
    queue: str
    ready: int
    running: int
    scheduled: int
    parked: int


_COUNTS = Rows(_Counts)


def queue_counts() -> Op[dict[str, dict[str, int]]]:
    """Live counts per queue: ready, running, scheduled, and parked for their
    key's room (a scan of the queue tables)."""
    counts = yield from select(query("queue_counts"), None, _COUNTS)
    return {
        c.queue: {
            "ready": c.ready,
            "running": c.running,
            "scheduled": c.scheduled,
            "parked": c.parked,
        }
        for c in counts
    }


@dataclass(frozen=True)
class QueueRow:
    name: str
    paused: bool
    waiting: int
    running: int  # claims running (rota.claims)
    scheduled: int
    dead: int
    per_minute: float  # completions, over the last five minutes
    oldest_wait_seconds: float | None
    counted_at: datetime | None  # when maintenance last refreshed the figures
    prefetched: int = 0  # claimed, not started


_QUEUES = Rows(
    QueueRow,
    waiting=int,
    running=int,
    prefetched=int,
    scheduled=int,
    dead=int,
    per_minute=float,
    oldest_wait_seconds=optional_float,
)


def queues() -> Op[list[QueueRow]]:
    return select(query("overview_queues"), None, _QUEUES)


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
    # Over the last `fair_minutes` whole minutes, per minute (one definition:
    # rota.core.history.FairShare, as the tenant's page shows it).
    fair_minutes: int = 0
    served_per_minute: float = 0.0
    demand_per_minute: float = 0.0
    fair_share_per_minute: float | None = None
    fair_standing: str | None = None  # at, below or above its fair share
    prefetched: int = 0  # claimed, not started
    # Its claims, running or prefetched: what its concurrency limit counts.
    claimed: int = 0


_TENANT_PAGE = Both(
    Rows(
        TenantRow,
        extra=["served"],  # the sort key of served per minute
        weight=float,
        waiting=int,
        running=int,
        prefetched=int,
        claimed=int,
        rate_limit=optional_float,
        tokens=optional_float,
        scheduled=int,
        dead=int,
        oldest_wait_seconds=optional_float,
    ),
    Rows(int, ["total"]),
)


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
    check_page(offset, limit)
    if not isinstance(prefix, str) or len(prefix) > 128 or "\x00" in prefix:
        raise ValidationError(
            "a tenant name prefix is a string of at most 128 characters, without NUL"
        )
    return _tenants(
        {
            "sort": sort,
            "descending": descending,
            "prefix": prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_"),
            "offset": offset,
            "limit": limit,
            "minutes": FAIR_MINUTES,
        }
    )


def _tenants(params: dict[str, Any]) -> Op[TenantPage]:
    rows = yield from select(query("tenant_rows"), params, _TENANT_PAGE)
    # One statement for the page; tenants are never deleted: each is found.
    fair = yield from fair_shares([row.name for row, _ in rows])
    page = [dataclasses.replace(r, **fair[r.name].as_fields()) for r, _ in rows]
    return TenantPage(page, next((total for _, total in rows), 0))


@dataclass(frozen=True)
class TopTenant:
    name: str
    paused: bool
    waiting: int
    running: int
    dead: int
    prefetched: int = 0  # claimed, not started


_TOP_TENANTS = Rows(TopTenant, waiting=int, running=int, dead=int, prefetched=int)


def top_tenants(limit: int = 10) -> Op[tuple[list[TopTenant], int]]:
    """The tenants with the most tasks waiting, and how many tenants there are."""
    check_page(0, limit)
    return _top_tenants(limit)


def _top_tenants(limit: int) -> Op[tuple[list[TopTenant], int]]:
    top = yield from select(query("top_tenants"), {"limit": limit}, _TOP_TENANTS)
    count = yield from value(query("tenant_count"))
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
    prefetched: int = 0  # claimed, not started


_TENANT_QUEUES = Rows(
    TenantQueue,
    extra=["at"],
    waiting=int,
    running=int,
    prefetched=int,
    scheduled=int,
    dead=int,
    oldest_wait_seconds=optional_float,
)


@dataclass(frozen=True)
class TenantDetail:
    name: str
    slot: int
    weight: float
    paused: bool
    concurrency_limit: int | None
    running: int  # claims, against the concurrency limit (kept only while one is set)
    rate_limit: float | None
    rate_burst: float
    tokens: float | None
    capacity: int | None
    backlog: float | None  # estimated waiting work, in cost units
    created_at: datetime
    queues: list[TenantQueue] = dataclasses.field(default_factory=list)
    service: list[tuple[datetime, int, float | None]] = dataclasses.field(
        default_factory=list
    )  # minute, completions, mean wait (s)
    # Over the last `fair_minutes` whole minutes, per minute, as the tenants
    # list: rota.core.history.FairShare says what each counts.
    fair_minutes: int = 0
    served_per_minute: float = 0.0
    demand_per_minute: float = 0.0
    fair_share_per_minute: float | None = None
    fair_standing: str | None = None  # at, below or above its fair share


_TENANT_DETAIL = Rows(
    TenantDetail,
    slot=int,
    weight=float,
    running=int,
    rate_limit=optional_float,
    rate_burst=float,
    tokens=optional_float,
    backlog=optional_float,
)


def tenant(name: str) -> Op[TenantDetail | None]:
    check_tenant(name)
    return _tenant(name)


def _tenant(name: str) -> Op[TenantDetail | None]:
    detail = yield from first(query("tenant_detail"), {"name": name}, _TENANT_DETAIL)
    if detail is None:
        return None
    of = {"tenant_id": detail.slot}
    per_queue = yield from select(query("tenant_queues_stats"), of, _TENANT_QUEUES)
    minutes = yield from select(query("tenant_service"), of, _MINUTES)
    service = [(m.minute, m.completed, m.wait_seconds) for m in minutes]

    fair = yield from fair_shares([name])
    found = dataclasses.replace(detail, queues=per_queue, service=service)
    return dataclasses.replace(found, **fair[name].as_fields()) if name in fair else found


class _Minute(NamedTuple):
    minute: datetime
    completed: int
    wait_seconds: float | None


_MINUTES = Rows(_Minute, completed=int, wait_seconds=optional_float)


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


TASK_ROWS = Rows(TaskRow)


def tasks(
    state: str,
    *,
    tenant: str | None = None,
    queue: str | None = None,
    limit: int = 50,
) -> Op[list[TaskRow]]:
    """Tasks in one state (ready in line order, running and claimed, not
    started, by claim time, scheduled by run time, dead and cancelled the
    most recent first)."""
    check_page(0, limit)
    return _tasks(ids_statement(state, tenant, queue), task_params(state, tenant, queue, limit))


def ids_statement(state: str, tenant: str | None, queue: str | None) -> str:
    """The statement listing the ids of a state's tasks, its filter checked."""
    if state not in TASK_STATES:
        raise ValidationError(f"state must be one of {', '.join(TASK_STATES)}, got {state!r}")
    if tenant is not None:
        check_tenant(tenant)
    if queue is not None:
        check_queue(queue)
    return {
        "ready": query("ready_ids"),
        "running": query("claim_ids"),
        "claimed": query("claim_ids"),
        "scheduled": query("scheduled_ids"),
        "dead": query("dead_ids"),  # by the partial index of dead tasks
        "cancelled": query("cancelled_ids"),
    }[state]


def task_params(state: str, tenant: str | None, queue: str | None, limit: int) -> dict[str, Any]:
    return {"state": state, "tenant": tenant, "queue": queue, "limit": limit, "since": None}


def _tasks(statement: str, params: dict[str, Any]) -> Op[list[TaskRow]]:
    ids = yield from values(statement, params)
    if not ids:
        return []
    return (yield from select(query("task_rows"), {"ids": UUIDArray(ids)}, TASK_ROWS))


@dataclass(frozen=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    silent_seconds: float
    running: int  # its claims running: at most its concurrency (rota.claims)
    prefetched: int  # its claims not started


def workers() -> Op[list[WorkerRow]]:
    return select(query("workers_view"), None, _WORKERS)


_WORKERS = Rows(WorkerRow, queues=list, silent_seconds=float, running=int, prefetched=int)


@dataclass(frozen=True)
class LoaderBatch:
    checkpoint: str
    batch_id: int
    tasks: int
    loaded_at: datetime


def loader_batches() -> Op[list[LoaderBatch]]:
    """The Spark loaders' last micro-batch, per checkpoint."""
    return select(query("loader_batches"), None, Rows(LoaderBatch))


@dataclass(frozen=True)
class AuditRow:
    at: datetime
    actor: str
    action: str
    target: str
    count: int
    detail: str


def audit(limit: int = 50) -> Op[list[AuditRow]]:
    check_page(0, limit)
    return _audit(limit)


def _audit(limit: int) -> Op[list[AuditRow]]:
    return select(query("recent_audit"), {"limit": limit}, _AUDIT)


_AUDIT = Rows(AuditRow)


@dataclass(frozen=True)
class QueuePace:
    """A queue's recent completion rate (rota.service, counted by maintenance)."""

    completed: int  # over `seconds`: the last whole minutes and the current one's counted part
    seconds: float
    counted_seconds_ago: float  # since maintenance last counted completions

    @property
    def per_minute(self) -> float:
        return self.completed * 60 / self.seconds if self.seconds > 0 else 0.0


_PACE = Rows(QueuePace, completed=int, seconds=float, counted_seconds_ago=float)


def queue_pace(queue: str, minutes: int = 5) -> Op[QueuePace | None]:
    """The queue's completions in the last `minutes` whole minutes and the
    current one so far; None while maintenance never counted any."""
    check_queue(queue)
    if type(minutes) is not int or not 1 <= minutes <= 60:
        raise ValidationError(f"minutes must be a whole number from 1 to 60, got {minutes!r}")
    return first(query("queue_pace"), {"queue": queue, "minutes": minutes}, _PACE)


def ping() -> Op[None]:
    """A round trip (readiness)."""
    yield Execute(query("ping"))
