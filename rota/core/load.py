"""Producers and loaders: tasks into the tables, each at its fair place in
line (docs/explanation/architecture.md, "Fairness")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import repeat
from typing import Any, NamedTuple
from uuid import UUID

import psycopg

from rota.core.db import Copy, Execute, Op, Send, UUIDArray, UUIDBytesArray, select, values
from rota.core.rows import ONLY, Rows
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
# With the tasks' priorities and limit keys (copy_tasks_options), used only
# when a task of the chunk has one: tasks at 0 without a key (most) cost the
# load nothing more.
TASK_COPY_TYPES_OPTIONS = (*TASK_COPY_TYPES, "int2", "text")
# With the joins the tasks are members of too (copy_tasks_members): a workflow's.
TASK_COPY_TYPES_MEMBERS = (*TASK_COPY_TYPES_OPTIONS, "uuid")
# Up to this many tasks a load is one INSERT (insert_tasks): in a transaction
# of its own, one round trip in all against a COPY's four. Beyond it, COPY
# costs less per row.
SMALL_LOAD = 64


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


def load(
    envelopes: Iterable[TaskEnvelope],
    last: bool = True,
    joins: Mapping[UUID, UUID] | None = None,
) -> Op[int]:
    """Bulk-loads tasks with their fair positions: COPY into rota.tasks (one
    INSERT up to SMALL_LOAD tasks), whose insert trigger gives them their
    places in line (rota.tasks_enter_line). Tasks loaded or run before (same
    id) are ignored. Run it in a transaction (db.transact); `last=False` when
    the operation goes on after it. `joins`: the join of each task that is a
    workflow's member. Returns how many were new."""
    tasks = _first_of_each_id(envelopes)
    if not tasks:
        return 0
    if len(tasks) <= SMALL_LOAD:
        (stored,) = yield Execute(query("insert_tasks"), _columns(tasks, joins), ONLY, alone=last)
        return int(stored)
    # The savepoint comes first so that it travels with BEGIN and the
    # preparation (db.transact); a batch loaded again rolls back to it and
    # prepares what is left.
    yield Send(query("load_savepoint"))
    numbered, copy = yield from _prepared(tasks, joins)
    try:
        yield copy
    except psycopg.errors.UniqueViolation:
        # Rare: a batch loaded again (a loader died before acknowledging it).
        # Checking first would cost every batch a probe of the whole table.
        yield Execute(query("load_rollback_to_savepoint"))
        loaded = set(
            (yield from values(query("existing_tasks"), {"ids": UUIDArray(t.id for t in tasks)}))
        )
        tasks = [t for t in tasks if t.id not in loaded]
        if not tasks:
            return 0
        numbered, copy = yield from _prepared(tasks, joins)
        yield copy
    return len(numbered)


def _preparing(tasks: list[TaskEnvelope]) -> dict[str, Any]:
    """load_prepare's parameters, which insert_tasks takes too: the names
    (sorted: their ids come back in this order), the count and the ids."""
    return {
        "queues": sorted({t.queue for t in tasks}),
        "tenants": sorted({t.tenant for t in tasks}),
        "count": len(tasks),
        "ids": UUIDArray(t.id for t in tasks),
    }


def _columns(tasks: list[TaskEnvelope], joins: Mapping[UUID, UUID] | None = None) -> dict[str, Any]:
    """insert_tasks's parameters: load_prepare's, and the tasks column by column."""
    params = _preparing(tasks)
    queue_of = {name: i for i, name in enumerate(params["queues"], 1)}
    tenant_of = {name: i for i, name in enumerate(params["tenants"], 1)}
    return {
        **params,
        "queue_of": [queue_of[t.queue] for t in tasks],
        "tenant_of": [tenant_of[t.tenant] for t in tasks],
        "names": [t.name for t in tasks],
        "payloads": [t.payload for t in tasks],
        "costs": [float(t.cost) for t in tasks],
        "max_attempts": [t.max_attempts for t in tasks],
        "backoff_bases": [float(t.backoff_base) for t in tasks],
        "backoff_maxes": [float(t.backoff_max) for t in tasks],
        "etas": [t.eta for t in tasks],
        "enqueued": [t.enqueued_at for t in tasks],
        "priorities": [t.priority for t in tasks],
        "limit_keys": [t.limit_key for t in tasks],
        "join_ids": [joins.get(t.id) for t in tasks] if joins else None,
    }


def _prepared(
    tasks: list[TaskEnvelope], joins: Mapping[UUID, UUID] | None = None
) -> Op[tuple[list[tuple[int, TaskEnvelope]], Copy]]:
    """The tasks with their sequence numbers (less those that already ran),
    and the COPY that stores them (with each member's join, of `joins`)."""
    params = _preparing(tasks)
    (ready,) = yield from select(query("load_prepare"), params, _PREPARED)
    queue_id = dict(zip(params["queues"], ready.queue_ids, strict=True))
    tenant_id = dict(zip(params["tenants"], ready.tenant_ids, strict=True))
    numbered = _without(list(zip(ready.seqs, tasks, strict=True)), ready.already_ran)
    if joins:
        rows = task_rows(numbered, queue_id, tenant_id, ready.now, True)
        members = ((*row, joins.get(t.id)) for row, (_, t) in zip(rows, numbered, strict=True))
        return numbered, Copy(query("copy_tasks_members"), members, TASK_COPY_TYPES_MEMBERS)
    options = any(t.priority for t in tasks) or any(t.limit_key for t in tasks)
    rows = task_rows(numbered, queue_id, tenant_id, ready.now, options)
    if options:
        return numbered, Copy(query("copy_tasks_options"), rows, TASK_COPY_TYPES_OPTIONS)
    return numbered, Copy(query("copy_tasks"), rows, TASK_COPY_TYPES)


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
    options: bool = False,
) -> Iterator[tuple[Any, ...]]:
    """The rows of the copy_tasks block (column types TASK_COPY_TYPES), or
    with `options` of copy_tasks_options (TASK_COPY_TYPES_OPTIONS)."""
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
        yield (*row, t.priority, t.limit_key) if options else row


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


class TaskColumns(NamedTuple):
    """Checked tasks column by column (`rota import`'s executors build them
    from Arrow batches), each list as long as `ids`: what `load_columns`
    loads, field for field a TaskEnvelope's."""

    ids: list[bytes]  # each id's 16 bytes
    queues: list[str]
    tenants: list[str]
    names: list[str]
    payloads: list[str]
    costs: list[float]
    max_attempts: list[int]
    etas: list[datetime | None]
    priorities: list[int]
    enqueued_at: datetime
    backoff_base: float = 1.0
    backoff_max: float = 3600.0

    def part(self, rows: Sequence[int] | slice) -> TaskColumns:
        """The tasks at `rows` (positions, in order, or a slice)."""
        parts: dict[str, Any]
        if isinstance(rows, slice):
            parts = {f: getattr(self, f)[rows] for f in _PER_TASK}
        else:
            parts = {f: [getattr(self, f)[i] for i in rows] for f in _PER_TASK}
        return self._replace(**parts)


_PER_TASK = TaskColumns._fields[:9]  # the lists; the fields after them are every task's
# copy_tasks's column types for TaskColumns' rows: binary COPY sends a uuid as
# its 16 bytes, which is what the bytea dumper writes of the id's bytes.
_COLUMN_COPY_TYPES = ("bytea", *TASK_COPY_TYPES[1:])
_COLUMN_COPY_TYPES_OPTIONS = ("bytea", *TASK_COPY_TYPES_OPTIONS[1:])


def load_columns(tasks: TaskColumns) -> Op[int]:
    """`load` for tasks given column by column: the same statements (one
    INSERT up to SMALL_LOAD tasks, else load_prepare and COPY, the insert
    trigger giving each task its place in line, in the columns' order).
    Tasks loaded or run before (same id) are ignored. Run it in a transaction
    (db.transact). Returns how many were new."""
    tasks = _first_of_each_column_id(tasks)
    if not tasks.ids:
        return 0
    if len(tasks.ids) <= SMALL_LOAD:
        params = _column_params(tasks)
        (stored,) = yield Execute(query("insert_tasks"), params, ONLY, alone=True)
        return int(stored)
    yield Send(query("load_savepoint"))
    count, copy = yield from _prepared_columns(tasks)
    try:
        yield copy
    except psycopg.errors.UniqueViolation:
        # Rare: part of the tasks loaded before (an import retried).
        yield Execute(query("load_rollback_to_savepoint"))
        ids = UUIDBytesArray(tasks.ids)
        stored = {u.bytes for u in (yield from values(query("existing_tasks"), {"ids": ids}))}
        tasks = tasks.part([i for i, raw in enumerate(tasks.ids) if raw not in stored])
        if not tasks.ids:
            return 0
        count, copy = yield from _prepared_columns(tasks)
        yield copy
    return count


def _first_of_each_column_id(tasks: TaskColumns) -> TaskColumns:
    seen = set(tasks.ids)
    if len(seen) == len(tasks.ids):
        return tasks  # the usual case: no id twice
    seen.clear()
    first = []
    for i, raw in enumerate(tasks.ids):
        if raw not in seen:
            seen.add(raw)
            first.append(i)
    return tasks.part(first)


def _column_preparing(tasks: TaskColumns) -> dict[str, Any]:
    return {
        "queues": sorted(set(tasks.queues)),
        "tenants": sorted(set(tasks.tenants)),
        "count": len(tasks.ids),
        "ids": UUIDBytesArray(tasks.ids),
    }


def _column_params(tasks: TaskColumns) -> dict[str, Any]:
    """insert_tasks's parameters (as `_columns` makes them of envelopes)."""
    params = _column_preparing(tasks)
    queue_of = {name: i for i, name in enumerate(params["queues"], 1)}
    tenant_of = {name: i for i, name in enumerate(params["tenants"], 1)}
    n = len(tasks.ids)
    return {
        **params,
        "queue_of": list(map(queue_of.__getitem__, tasks.queues)),
        "tenant_of": list(map(tenant_of.__getitem__, tasks.tenants)),
        "names": tasks.names,
        "payloads": tasks.payloads,
        "costs": [float(c) for c in tasks.costs],
        "max_attempts": tasks.max_attempts,
        "backoff_bases": [float(tasks.backoff_base)] * n,
        "backoff_maxes": [float(tasks.backoff_max)] * n,
        "etas": tasks.etas,
        "enqueued": [tasks.enqueued_at] * n,
        "priorities": tasks.priorities,
        "limit_keys": [None] * n,  # an import's tasks name no key
        "join_ids": None,  # nor a join
    }


def _prepared_columns(tasks: TaskColumns) -> Op[tuple[int, Copy]]:
    """How many tasks the COPY stores (less those that already ran), and the
    COPY, its rows zipped from the columns."""
    params = _column_preparing(tasks)
    (ready,) = yield from select(query("load_prepare"), params, _PREPARED)
    if ready.already_ran:
        ran = {u.bytes for u in ready.already_ran}
        keep = [i for i, raw in enumerate(tasks.ids) if raw not in ran]
        seqs = [ready.seqs[i] for i in keep]
        tasks = tasks.part(keep)
    else:
        seqs = ready.seqs
    queue_id = dict(zip(params["queues"], ready.queue_ids, strict=True))
    tenant_id = dict(zip(params["tenants"], ready.tenant_ids, strict=True))
    now = ready.now
    statuses: Iterable[str] = (
        ["scheduled" if eta is not None and eta > now else "pending" for eta in tasks.etas]
        if any(eta is not None for eta in tasks.etas)
        else repeat("pending")
    )
    columns: list[Iterable[Any]] = [
        tasks.ids,
        seqs,
        map(queue_id.__getitem__, tasks.queues),
        map(tenant_id.__getitem__, tasks.tenants),
        tasks.names,
        tasks.payloads,
        tasks.costs,
        tasks.max_attempts,
        repeat(tasks.backoff_base),
        repeat(tasks.backoff_max),
        statuses,
        tasks.etas,
        repeat(tasks.enqueued_at),
        tasks.tenants,
    ]
    count = len(tasks.ids)
    if any(tasks.priorities):
        # repeat() is endless; an import's tasks name no key.
        rows = zip(*columns, tasks.priorities, repeat(None), strict=False)
        return count, Copy(query("copy_tasks_options"), rows, _COLUMN_COPY_TYPES_OPTIONS)
    return count, Copy(query("copy_tasks"), zip(*columns, strict=False), _COLUMN_COPY_TYPES)
