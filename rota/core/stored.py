"""A task's story as PostgreSQL has it, read live, with what decides its
wait (the read model's; rota.readmodel.story tells it in words)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from rota.core.db import Op, first, select, value
from rota.core.rows import Both, Rows
from rota.core.workflows import TaskGraph, task_graph
from rota.errors import ValidationError
from rota.sql import query

# Tasks counted one by one ahead of a ready task at most (an index range
# scan); past this the number is estimated from a sample of about
# AHEAD_SAMPLE_ROWS rows, so the count costs the same at any depth.
AHEAD_CAP = 10_000
AHEAD_SAMPLE_ROWS = 20_000


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
    max_attempts: int | None  # None: not kept (a succeeded task's record predates it)
    cost: float | None  # None: not kept (as max_attempts)
    eta: datetime | None
    enqueued_at: datetime
    loaded_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    traceback: str | None
    cancel_requested: bool
    worker: str | None  # claimed: who holds it
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
    priority: int = 0  # within its tenant: 0 (normal) to 9, higher first
    ahead: int | None = None  # ready: claimable tasks ahead of it (of its turn, if urgent)
    ahead_estimated: bool = False  # past AHEAD_CAP: `ahead` is from a sample
    queue_workers: int = 0  # live workers that claim its queue
    history: tuple[tuple[datetime, str, str], ...] = ()  # (when, who, what) from the audit
    # When its last attempt started (succeeded: the worker's measure, or its
    # claim's time where not told; claimed: as its heartbeat told, None: not
    # known to have started).
    started_at: datetime | None = None
    # Claimed: whether its claim runs, or waits prefetched for a free slot
    # of its worker (rota.claims).
    claim_running: bool | None = None
    ran_seconds: float | None = None  # succeeded: as its worker measured (None: not told)
    # Ready and urgent: its tenant's tasks that run before it (more urgent, or
    # as urgent and earlier), and the lower-priority ones ahead of it in line
    # that it runs before (past AHEAD_CAP: AHEAD_CAP + 1).
    urgent_before: int = 0
    graph: TaskGraph | None = None  # its place in a workflow (rota.workflow), if any
    lower_ahead: int = 0
    limit_key: str | None = None  # its key of a limit on keys (rota.Limit), if any
    key_running: int | None = None  # the key's running tasks, while its limit exists
    key_concurrency: int | None = None
    key_rate: float | None = None
    key_tokens: float | None = None
    parked: bool = False  # waiting out of line for its key's room


def stored_task(task_id: UUID) -> Op[StoredTask | None]:
    """A task's whole story in PostgreSQL (None if it is not there)."""
    if not isinstance(task_id, UUID):
        raise ValidationError("a task id is a UUID")
    return _stored_task(task_id)


def _stored_task(task_id: UUID) -> Op[StoredTask | None]:
    audit = yield from select(query("task_audit"), {"id": str(task_id)}, _HISTORY)
    history = tuple((entry.at, entry.actor, entry.action) for entry in audit)
    found_graph = yield from task_graph(task_id)
    in_graph = found_graph.join_id is not None or found_graph.members is not None
    graph = found_graph if in_graph else None
    found = yield from first(query("task_story"), {"id": task_id}, _STORY)
    if found is None:
        done = yield from first(query("finished_story"), {"id": task_id}, _FINISHED)
        return None if done is None else dataclasses.replace(done, history=history, graph=graph)
    task, kept = found
    workers = yield from value(query("queue_workers"), {"queue": task.queue})
    ahead, estimated, turn = None, False, None
    if task.status == "pending" and task.worker is None:
        mine = {"queue_id": kept.queue_id, "tenant_id": kept.tenant_id, "seq": kept.seq}
        if task.priority > 0:  # it runs at one of its tenant's turns: count from there
            turn = yield from first(query("urgent_turn"), {**mine, "cap": AHEAD_CAP + 1}, _TURN)
            if turn is not None and turn.turn_seq is not None:
                mine["seq"] = turn.turn_seq
        place = yield from first(query("place_in_line"), {**mine, "cap": AHEAD_CAP + 1}, _PLACE)
        ahead = None if place is None else int(place.ahead)
        if place is not None and place.ahead > AHEAD_CAP:
            rows = yield from value(query("ready_rows"))
            percent = min(100.0, 100.0 * AHEAD_SAMPLE_ROWS / max(float(rows), 1.0))
            scaled = yield from value(
                query("place_estimate"), {**mine, "vtime": place.vtime, "percent": percent}
            )
            # At least what was counted: a small sample can undercount.
            ahead, estimated = max(AHEAD_CAP + 1, round(float(scaled))), True
    return dataclasses.replace(
        task,
        history=history,
        graph=graph,
        ahead=ahead,
        ahead_estimated=estimated,
        queue_workers=int(workers),
        urgent_before=0 if turn is None else int(turn.better),
        lower_ahead=0 if turn is None else int(turn.lower_ahead),
    )


class _Kept(NamedTuple):
    """Where a task's row is kept: the key of its place in line."""

    seq: int
    queue_id: int
    tenant_id: int


class _Place(NamedTuple):
    vtime: float
    ahead: int


class _Turn(NamedTuple):
    better: int
    lower_ahead: int
    turn_seq: int | None


class _Entry(NamedTuple):
    at: datetime
    actor: str
    action: str


def _finished(
    id: UUID,
    queue: str,
    tenant: str,
    attempts: int,
    max_attempts: int | None,
    cost: float | None,
    enqueued_at: datetime,
    started_at: datetime | None,
    finished_at: datetime | None,
    claimed_at: datetime | None,
    ran_seconds: float | None,
) -> StoredTask:
    """A task that succeeded, from its record (rota.finished): what the
    record does not keep (name, payload; attempts allowed and cost in records
    that predate keeping them; its claim's time and its run's seconds in
    records that predate keeping them, whose start is their claim's) is
    left empty or None, never made up."""
    return StoredTask(
        id=id,
        queue=queue,
        tenant=tenant,
        name="",
        payload="",
        status="succeeded",
        attempts=int(attempts),
        max_attempts=None if max_attempts is None else int(max_attempts),
        cost=None if cost is None else float(cost),
        eta=None,
        enqueued_at=enqueued_at,
        loaded_at=None,
        finished_at=finished_at,
        last_error=None,
        traceback=None,
        cancel_requested=False,
        worker=None,
        attempt=None,
        claimed_at=claimed_at,
        lease_expires_at=None,
        run_at=None,
        started_at=started_at,
        ran_seconds=None if ran_seconds is None else float(ran_seconds),
    )


_STORY = Both(Rows(StoredTask), Rows(_Kept))
_FINISHED = Rows(_finished)
_PLACE = Rows(_Place)
_TURN = Rows(_Turn)
_HISTORY = Rows(_Entry)
