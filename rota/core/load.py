"""Producers and loaders: tasks into the tables, each at its fair place in
line (docs/explanation/architecture.md, "Fairness").

Every load is `load` of one `TaskColumns`: envelopes become columns in
`columns_of`, buffer entries in rota.loader.store (`batch_columns`), imported
rows in rota.loader.columns. Up to SMALL_LOAD tasks go in one INSERT, more by
COPY; the scheduled-or-pending rule and a duplicate's retry are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from itertools import chain
from typing import Any, NamedTuple
from uuid import UUID

import psycopg

from rota.core.copyrows import (
    TASK_COPY_TYPES,
    TASK_COPY_TYPES_LEAN,
    TASK_COPY_TYPES_MEMBERS,
    TASK_COPY_TYPES_OPTIONS,
    copy_rows,
    keeps_defaults,
)
from rota.core.db import Copy, Execute, Op, Send, UUIDArray, UUIDBytesArray, select, values
from rota.core.rows import ONLY, Rows
from rota.model.envelope import TaskEnvelope
from rota.sql import query

# Up to this many tasks a load is one INSERT (insert_tasks): in a transaction
# of its own, one round trip in all against a COPY's four. Beyond it, COPY
# costs less per row.
SMALL_LOAD = 64


@dataclass(frozen=True, slots=True)
class TaskColumns:
    """Checked tasks column by column, in load order: what `load` takes.
    Every list is as long as `ids`; field for field a TaskEnvelope's."""

    ids: UUIDArray | UUIDBytesArray  # UUIDs, or each id's 16 bytes (`rota import`)
    queues: list[str]
    tenants: list[str]
    names: list[str]
    payloads: list[str]
    costs: list[float]
    max_attempts: list[int]
    backoff_bases: list[float]
    backoff_maxes: list[float]
    etas: list[datetime | None]
    enqueued: list[datetime]
    priorities: list[int]
    limit_keys: list[str | None]
    join_ids: list[UUID | None] | None = None  # each task's join (a workflow's); None: none has one

    def __len__(self) -> int:
        return len(self.ids)

    def part(self, rows: Sequence[int] | slice) -> TaskColumns:
        """The tasks at `rows` (positions, in order, or a slice)."""
        if isinstance(rows, slice):
            if rows.indices(len(self.ids)) == (0, len(self.ids), 1):
                return self  # all of them: no copy

            def pick(column: list[Any]) -> list[Any]:
                return column[rows]

        else:

            def pick(column: list[Any]) -> list[Any]:
                return [column[i] for i in rows]

        joins = None if self.join_ids is None else pick(self.join_ids)
        lists = {f: pick(getattr(self, f)) for f in _LISTS}
        return replace(self, ids=type(self.ids)(pick(self.ids)), join_ids=joins, **lists)

    @staticmethod
    def joined(parts: Sequence[TaskColumns]) -> TaskColumns:
        """The tasks of `parts` (their ids of one kind), in order, as one."""
        if len(parts) == 1:
            return parts[0]

        def chained(name: str) -> list[Any]:
            return list(chain.from_iterable(getattr(p, name) for p in parts))

        joins = None
        if any(p.join_ids is not None for p in parts):
            joins = list(chain.from_iterable(p.join_ids or [None] * len(p) for p in parts))
        ids = type(parts[0].ids)(chained("ids"))
        return replace(parts[0], ids=ids, join_ids=joins, **{f: chained(f) for f in _LISTS})

    def envelope(self, i: int) -> TaskEnvelope:
        """Task `i` as an envelope (one PostgreSQL refused, say)."""
        raw = self.ids[i]
        return TaskEnvelope(
            raw if isinstance(raw, UUID) else UUID(bytes=raw),
            self.queues[i],
            self.tenants[i],
            self.names[i],
            self.payloads[i],
            self.enqueued[i],
            self.costs[i],
            self.max_attempts[i],
            self.backoff_bases[i],
            self.backoff_maxes[i],
            self.etas[i],
            self.priorities[i],
            self.limit_keys[i],
        )


_LISTS = tuple(f.name for f in fields(TaskColumns))[1:-1]  # between the ids and the joins


def columns_of(
    envelopes: Iterable[TaskEnvelope], joins: Mapping[UUID, UUID] | None = None
) -> TaskColumns:
    """Envelopes as a load's columns; `joins`: the join of each task that is
    a workflow's member."""
    tasks = envelopes if isinstance(envelopes, list) else list(envelopes)
    return TaskColumns(
        UUIDArray([t.id for t in tasks]),
        [t.queue for t in tasks],
        [t.tenant for t in tasks],
        [t.name for t in tasks],
        [t.payload for t in tasks],
        [t.cost for t in tasks],
        [t.max_attempts for t in tasks],
        [t.backoff_base for t in tasks],
        [t.backoff_max for t in tasks],
        [t.eta for t in tasks],
        [t.enqueued_at for t in tasks],
        [t.priority for t in tasks],
        [t.limit_key for t in tasks],
        [joins.get(t.id) for t in tasks] if joins else None,
    )


class _Prepared(NamedTuple):
    """What a load learns before its rows go in (load.sql's load_prepare)."""

    queue_ids: list[int]
    tenant_ids: list[int]
    now: datetime
    seqs: list[int]
    already_ran: list[UUID]


_PREPARED = Rows(_Prepared)


def commit_without_flush() -> Op[None]:
    """This connection's commits no longer wait for the WAL flush: what a load
    commits is claimable at once. Acknowledge what was loaded only after
    `flush_commits`."""
    yield Execute(query("commit_without_flush"))


def flush_commits() -> Op[None]:
    """Waits until every commit this connection made before is flushed, as the
    server's synchronous_commit asks of a commit (its own transaction)."""
    yield Execute(query("flush_commits"), alone=True)


def load(tasks: TaskColumns | Iterable[TaskEnvelope], last: bool = True) -> Op[int]:
    """Bulk-loads tasks (envelopes become columns: `columns_of`) with their
    fair positions: COPY into rota.tasks (one INSERT up to SMALL_LOAD tasks),
    whose insert trigger gives them their places in line
    (rota.tasks_enter_line), in the columns' order. Tasks loaded or run
    before (same id) are ignored, as is an id's second task. Run it in a
    transaction (db.transact); `last=False` when the operation goes on after
    it. Returns how many were new."""
    tasks = _first_of_each_id(tasks if isinstance(tasks, TaskColumns) else columns_of(tasks))
    if not tasks.ids:
        return 0
    if len(tasks.ids) <= SMALL_LOAD:
        (stored,) = yield Execute(query("insert_tasks"), _inserting(tasks), ONLY, alone=last)
        return int(stored)
    # The savepoint comes first so that it travels with BEGIN and the
    # preparation (db.transact); a batch loaded again rolls back to it and
    # prepares what is left.
    yield Send(query("load_savepoint"))
    count, copy = yield from _prepared(tasks)
    try:
        yield copy
    except psycopg.errors.UniqueViolation:
        # Rare: a batch loaded again (a loader died before acknowledging it,
        # an import retried). Checking first would cost every batch a probe
        # of the whole table.
        yield Execute(query("load_rollback_to_savepoint"))
        stored = yield from values(query("existing_tasks"), {"ids": tasks.ids})
        tasks = tasks.part(_without(tasks, stored))
        if not tasks.ids:
            return 0
        count, copy = yield from _prepared(tasks)
        yield copy
    return count


def _first_of_each_id(tasks: TaskColumns) -> TaskColumns:
    ids = tasks.ids
    # Keyed by the ids' ints: UUID's own hash is a Python-level call.
    seen: set[Any] = set(ids) if isinstance(ids, UUIDBytesArray) else {u.int for u in ids}
    if len(seen) == len(ids):
        return tasks  # the usual case: no id twice
    seen.clear()
    first = []
    for i, key in enumerate(ids if isinstance(ids, UUIDBytesArray) else [u.int for u in ids]):
        if key not in seen:
            seen.add(key)
            first.append(i)
    return tasks.part(first)


def _without(tasks: TaskColumns, found: Sequence[UUID]) -> list[int]:
    """The places of the tasks whose ids are not among `found`."""
    skip: set[Any] = set(found)
    if isinstance(tasks.ids, UUIDBytesArray):
        skip = {u.bytes for u in found}
    return [i for i, task_id in enumerate(tasks.ids) if task_id not in skip]


def _preparing(tasks: TaskColumns) -> dict[str, Any]:
    """load_prepare's parameters, which insert_tasks takes too: the names
    (sorted: their ids come back in this order), the count and the ids."""
    return {
        "queues": sorted(set(tasks.queues)),
        "tenants": sorted(set(tasks.tenants)),
        "count": len(tasks.ids),
        "ids": tasks.ids,
    }


def _inserting(tasks: TaskColumns) -> dict[str, Any]:
    """insert_tasks's parameters: load_prepare's, and the tasks column by column."""
    params = _preparing(tasks)
    queue_of = {name: i for i, name in enumerate(params["queues"], 1)}
    tenant_of = {name: i for i, name in enumerate(params["tenants"], 1)}
    return {
        **params,
        "queue_of": list(map(queue_of.__getitem__, tasks.queues)),
        "tenant_of": list(map(tenant_of.__getitem__, tasks.tenants)),
        "names": tasks.names,
        "payloads": tasks.payloads,
        # float8[]: an int among them would make psycopg send another type.
        "costs": [float(c) for c in tasks.costs],
        "max_attempts": tasks.max_attempts,
        "backoff_bases": [float(b) for b in tasks.backoff_bases],
        "backoff_maxes": [float(b) for b in tasks.backoff_maxes],
        "etas": tasks.etas,
        "enqueued": tasks.enqueued,
        "priorities": tasks.priorities,
        "limit_keys": tasks.limit_keys,
        "join_ids": tasks.join_ids,
    }


def _prepared(tasks: TaskColumns) -> Op[tuple[int, Copy]]:
    """How many tasks the COPY stores (less those that already ran), and the
    COPY: copy_tasks, or with the tasks' options when one has any, or with
    their joins when they are a workflow's, or without the columns at their
    defaults when every task keeps them (copy_tasks_lean)."""
    params = _preparing(tasks)
    (ready,) = yield from select(query("load_prepare"), params, _PREPARED)
    seqs = ready.seqs
    if ready.already_ran:
        keep = _without(tasks, ready.already_ran)
        tasks, seqs = tasks.part(keep), [seqs[i] for i in keep]
    queue_id = dict(zip(params["queues"], ready.queue_ids, strict=True))
    tenant_id = dict(zip(params["tenants"], ready.tenant_ids, strict=True))
    types: Sequence[str]
    extra: tuple[list[Any], ...] = ()
    lean = False
    if tasks.join_ids is not None:
        statement, types = query("copy_tasks_members"), TASK_COPY_TYPES_MEMBERS
        extra = (tasks.priorities, tasks.limit_keys, tasks.join_ids)
    elif any(tasks.priorities) or any(tasks.limit_keys):
        statement, types = query("copy_tasks_options"), TASK_COPY_TYPES_OPTIONS
        extra = (tasks.priorities, tasks.limit_keys)
    elif keeps_defaults(tasks):
        statement, types, lean = query("copy_tasks_lean"), TASK_COPY_TYPES_LEAN, True
    else:
        statement, types = query("copy_tasks"), TASK_COPY_TYPES
    if isinstance(tasks.ids, UUIDBytesArray):
        types = ("bytea", *types[1:])
    rows = copy_rows(tasks, seqs, queue_id, tenant_id, ready.now, *extra, lean=lean)
    return len(tasks.ids), Copy(statement, rows, types)


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


def record_loader_batch(checkpoint: str, batch_id: int, part: int = 0) -> Op[bool]:
    """Records a Spark micro-batch's partition in the loader ledger; False if
    it was recorded before (a replay, to be skipped). Run it in the
    partition's transaction."""
    key = {"query": checkpoint, "batch_id": batch_id, "part": part}
    rows = yield Execute(query("record_loader_batch"), key)
    return bool(rows)


def count_loader_batch(checkpoint: str, batch_id: int, tasks: int, part: int = 0) -> Op[None]:
    """The tasks a recorded partition stored, in the same transaction."""
    key = {"query": checkpoint, "batch_id": batch_id, "part": part, "tasks": tasks}
    yield Execute(query("count_loader_batch"), key)
