"""Operators' actions: each is checked when called (before any connection is
used) and recorded in rota.audit with its actor."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

import orjson

from rota.core.db import Execute, Op, UUIDArray, select, value, values
from rota.core.rows import Rows
from rota.errors import ValidationError
from rota.model.rules import check_queue, check_tenant, check_tenant_settings, check_time
from rota.sql import query

TENANT_SETTINGS = ("weight", "concurrency_limit", "rate_limit", "rate_burst", "capacity")
# Tasks a bulk action takes at most per call.
MAX_BULK = 100_000


def configure_tenant(
    name: str,
    *,
    weight: float = 1.0,
    concurrency_limit: int | None = None,
    rate_limit: float | None = None,
    rate_burst: float | None = None,
    capacity: int | None = None,
) -> Op[int]:
    """Creates or changes a tenant, every setting as given (those not given
    are cleared); returns its slot (id)."""
    check_tenant(name)
    check_tenant_settings(
        weight=weight,
        concurrency_limit=concurrency_limit,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        capacity=capacity,
    )
    return value(
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


def patch_tenant(name: str, changes: dict[str, Any], actor: str) -> Op[int]:
    """Creates a tenant or changes only the settings in `changes` (None
    clears a limit; a weight cannot be cleared); returns its slot."""
    check_tenant(name)
    unknown = set(changes) - set(TENANT_SETTINGS)
    if unknown:
        raise ValidationError(f"unknown tenant settings {sorted(unknown)}")
    if "weight" in changes and changes["weight"] is None:
        raise ValidationError("weight cannot be cleared; give a number")
    check_tenant_settings(**changes)
    params = {"name": name, "changes": orjson.dumps(changes).decode(), "actor": actor}
    return value(query("patch_tenant"), params)


def cancel(task_ids: Sequence[UUID], actor: str) -> Op[dict[UUID, str]]:
    """Cancels tasks; returns {id: 'cancelled' | 'cancelling' (running: not
    retried once its attempt ends) | its end state}; unknown ids are absent."""
    _check_ids(task_ids)
    return _cancel({"ids": UUIDArray(task_ids), "actor": actor})


def _cancel(params: dict[str, Any]) -> Op[dict[UUID, str]]:
    cancelled = yield from select(query("cancel"), params, _CANCELLED)
    return {task.id: task.outcome for task in cancelled}


class _Cancelled(NamedTuple):
    id: UUID
    outcome: str


_CANCELLED = Rows(_Cancelled)


def retry(task_ids: Sequence[UUID], actor: str) -> Op[set[UUID]]:
    """Runs dead or cancelled tasks again (same ids, a fresh attempt budget);
    returns the ids retried."""
    _check_ids(task_ids)
    return _retry({"ids": UUIDArray(task_ids), "actor": actor, "target": "task"})


def _retry(params: dict[str, Any]) -> Op[set[UUID]]:
    return set((yield from values(query("retry"), params)))


def retry_dead(
    actor: str,
    *,
    tenant: str | None = None,
    queue: str | None = None,
    since: datetime | None = None,
    limit: int = MAX_BULK,
) -> Op[int]:
    """Runs again the dead tasks that match (of a tenant, of a queue, dead
    since a time), up to `limit`; returns how many."""
    if tenant is not None:
        check_tenant(tenant)
    if queue is not None:
        check_queue(queue)
    if since is not None:
        check_time("since", since)
    if type(limit) is not int or not 1 <= limit <= MAX_BULK:
        raise ValidationError(f"limit must be an integer from 1 to {MAX_BULK}, got {limit!r}")
    return _retry_dead({"tenant": tenant, "queue": queue, "since": since, "limit": limit}, actor)


def _retry_dead(params: dict[str, Any], actor: str) -> Op[int]:
    dead = yield from values(query("dead_ids"), params)
    if not dead:
        return 0
    target = "dead " + " ".join(f"{k}={v}" for k, v in params.items() if v is not None)
    retried = yield from values(
        query("retry"), {"ids": UUIDArray(dead), "actor": actor, "target": target}
    )
    return len(retried)


def pause_queue(name: str, paused: bool, actor: str) -> Op[bool]:
    """Pauses (or resumes) a queue: its tasks stay in line, unclaimed; False
    if there is no such queue."""
    check_queue(name)
    return value(query("pause_queue"), {"name": name, "paused": paused, "actor": actor})


def charge_queue(name: str, charge_time: bool, actor: str) -> Op[bool]:
    """Charges a queue's tenants by measured run time, or by declared cost
    alone; False if there is no such queue."""
    check_queue(name)
    return value(query("charge_queue"), {"name": name, "charge_time": charge_time, "actor": actor})


def pause_tenant(name: str, paused: bool, actor: str) -> Op[bool]:
    """Pauses (or resumes) a tenant in every queue; False if there is none."""
    check_tenant(name)
    return value(query("pause_tenant"), {"name": name, "paused": paused, "actor": actor})


def record(actor: str, action: str, target: str, count: int, detail: dict[str, Any]) -> Op[None]:
    """Records an action taken elsewhere (the buffer's dead letters) in the audit log."""
    yield Execute(
        query("record_action"),
        {
            "actor": actor,
            "action": action,
            "target": target,
            "count": count,
            "detail": orjson.dumps(detail).decode(),
        },
    )


def _check_ids(task_ids: Sequence[UUID]) -> None:
    if not all(isinstance(i, UUID) for i in task_ids):
        raise ValidationError("task ids must be UUIDs")
    if len(task_ids) > MAX_BULK:
        raise ValidationError(f"at most {MAX_BULK} task ids at once")


# -- the archive (`rota archive`) ----------------------------------------------

ArchiveRow = tuple[Any, ...]  # task_id, status, queue, tenant, name, payload, attempts,
# enqueued_at, started_at, finished_at, last_error


def archive_span(since: datetime | None, before: datetime) -> Op[tuple[Any, Any]]:
    """The first and the last end, in [since, before), of a task that
    succeeded, died or was cancelled ((None, None) when there is none)."""
    (span,) = yield from select(
        query("archive_span"),
        {"since": since or datetime.min.replace(tzinfo=UTC), "before": before},
        _SPAN,
    )
    return span.first, span.last


class _Span(NamedTuple):
    first: datetime | None
    last: datetime | None


_SPAN = Rows(_Span)


def archive_rows(start: datetime, end: datetime) -> Op[list[ArchiveRow]]:
    """The tasks that ended in [start, end), as `rota archive` writes them."""
    rows = yield Execute(query("archive_rows"), {"start": start, "end": end})
    return [tuple(row) for row in rows]


def record_archive(since: datetime | None, before: datetime, location: str, tasks: int) -> Op[None]:
    yield Execute(
        query("record_archive"),
        {"since": since, "before": before, "location": location, "tasks": tasks},
    )
