"""Producers and loaders: tasks into the tables, each at its fair place in
line (docs/architecture.md, "Fairness")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg

from rota.core.db import Copy, Execute, Op, UUIDArray, select, values
from rota.core.rows import Rows
from rota.model.envelope import TaskEnvelope
from rota.sql import query

# Column types of the copy_tasks block (rows from `task_rows`). The payload (a
# json column) and the status (an enum) go as text: in binary COPY their form
# is their text, and the text dumper skips psycopg's JSON wrapper.
TASK_COPY_TYPES = (
    "uuid",
    "int8",
    "int4",
    "int4",
    "text",
    "text",
    "float8",
    "int4",
    "float8",
    "float8",
    "text",
    "timestamptz",
    "timestamptz",
    "text",
)
# With the tasks' priorities (copy_tasks_priority), used only when a task of
# the chunk has one: tasks at 0 (most) cost the load nothing more.
TASK_COPY_TYPES_PRIORITY = (*TASK_COPY_TYPES, "int2")


class _Prepared(NamedTuple):
    """What a load learns before its rows go in (load.sql's load_prepare)."""

    queue_ids: list[int]
    tenant_ids: list[int]
    now: datetime
    seqs: list[int]
    already_ran: list[UUID]


_PREPARED = Rows(_Prepared)


def load(envelopes: Iterable[TaskEnvelope]) -> Op[int]:
    """Bulk-loads tasks with their fair positions: COPY into rota.tasks, whose
    insert trigger gives them their places in line (rota.tasks_enter_line).
    Tasks loaded or run before (same id) are ignored. Run it in a
    transaction. Returns how many were new."""
    tasks = _first_of_each_id(envelopes)
    if not tasks:
        return 0
    queues = sorted({t.queue for t in tasks})
    tenants = sorted({t.tenant for t in tasks})
    params = {
        "queues": queues,
        "tenants": tenants,
        "count": len(tasks),
        "ids": UUIDArray(t.id for t in tasks),
    }
    (ready,) = yield from select(query("load_prepare"), params, _PREPARED)
    queue_id = dict(zip(queues, ready.queue_ids, strict=True))
    tenant_id = dict(zip(tenants, ready.tenant_ids, strict=True))
    now = ready.now
    numbered = _without(list(zip(ready.seqs, tasks, strict=True)), ready.already_ran)
    urgent = any(t.priority for t in tasks)

    def copy_tasks(numbered: list[tuple[int, TaskEnvelope]]) -> Copy:
        rows = task_rows(numbered, queue_id, tenant_id, now, urgent)
        if urgent:
            return Copy(query("copy_tasks_priority"), rows, TASK_COPY_TYPES_PRIORITY)
        return Copy(query("copy_tasks"), rows, TASK_COPY_TYPES)

    yield Execute(query("load_savepoint"))
    try:
        yield copy_tasks(numbered)
    except psycopg.errors.UniqueViolation:
        # Rare: a batch loaded again (a loader died before acknowledging it).
        # Checking first would cost every batch a probe of the whole table.
        yield Execute(query("load_rollback_to_savepoint"))
        loaded = yield from values(
            query("existing_tasks"), {"ids": UUIDArray(t.id for _, t in numbered)}
        )
        numbered = _without(numbered, loaded)
        yield copy_tasks(numbered)
    return len(numbered)


def _first_of_each_id(envelopes: Iterable[TaskEnvelope]) -> list[TaskEnvelope]:
    envelopes = list(envelopes)
    # Keyed by the ids' ints: UUID's own hash is a Python-level call.
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
    priority: bool = False,
) -> Iterator[tuple[Any, ...]]:
    """The rows of the copy_tasks block (column types TASK_COPY_TYPES), or
    with `priority` of copy_tasks_priority (TASK_COPY_TYPES_PRIORITY)."""
    for seq, t in numbered:
        row = (
            t.id,
            seq,
            queue_id[t.queue],
            tenant_id[t.tenant],
            t.name,
            t.payload,
            t.cost,
            t.max_attempts,
            t.backoff_base,
            t.backoff_max,
            "scheduled" if t.eta is not None and t.eta > now else "pending",
            t.eta,
            t.enqueued_at,
            t.tenant,
        )
        yield (*row, t.priority) if priority else row


def tenant_backlogs() -> Op[dict[str, tuple[int, float]]]:
    """{tenant: (capacity, estimated waiting work)} of the tenants that have a
    capacity, for backpressure."""
    backlogs = yield from select(query("tenant_backlog"), None, _BACKLOGS)
    return {b.tenant: (b.capacity, b.backlog) for b in backlogs}


class _Backlog(NamedTuple):
    tenant: str
    capacity: int
    backlog: float


_BACKLOGS = Rows(_Backlog, backlog=float)


def record_loader_batch(checkpoint: str, batch_id: int) -> Op[bool]:
    """Records a Spark micro-batch in the loader ledger; False if it was
    recorded before (a replay, to be skipped). Run it in the batch's transaction."""
    rows = yield Execute(query("record_loader_batch"), {"query": checkpoint, "batch_id": batch_id})
    return bool(rows)


def count_loader_batch(checkpoint: str, batch_id: int, tasks: int) -> Op[None]:
    """The tasks a recorded micro-batch stored, in the same transaction."""
    yield Execute(
        query("count_loader_batch"), {"query": checkpoint, "batch_id": batch_id, "tasks": tasks}
    )
