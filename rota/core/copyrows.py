"""The rows a load COPYs into rota.tasks (load.sql's copy_tasks blocks), and
the same rows for the benchmarks' baselines, which COPY them elsewhere."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import repeat
from typing import TYPE_CHECKING, Any

from rota.model.envelope import TaskEnvelope

if TYPE_CHECKING:
    from rota.core.load import TaskColumns

# Column types of the copy_tasks block (rows from `task_rows`). The payload (a
# json column) and the status (an enum) go as text: in binary COPY their form
# is their text, and the text dumper skips psycopg's JSON wrapper. Ids given
# as their 16 bytes (UUIDBytesArray) go as "bytea": binary COPY sends a uuid
# as those bytes.
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
# copy_tasks_lean's: tasks that keep the defaults below and have no ETA
# (most) leave those columns to rota.tasks' defaults, which are these values:
# fewer values for the loader to write and the server to read per row.
TASK_COPY_TYPES_LEAN = ("uuid", "int8", "int4", "int4", "text", "text", "timestamptz", "text")
LEAN_COST, LEAN_MAX_ATTEMPTS, LEAN_BACKOFF_BASE, LEAN_BACKOFF_MAX = 1.0, 3, 1.0, 3600.0
LEAN_DEFAULTS: dict[str, float] = {
    "cost": LEAN_COST,
    "max_attempts": LEAN_MAX_ATTEMPTS,
    "backoff_base": LEAN_BACKOFF_BASE,
    "backoff_max": LEAN_BACKOFF_MAX,
}
# With the tasks' priorities and limit keys (copy_tasks_options), used only
# when a task of the chunk has one: tasks at 0 without a key (most) cost the
# load nothing more.
TASK_COPY_TYPES_OPTIONS = (*TASK_COPY_TYPES, "int2", "text")
# With the joins the tasks are members of too (copy_tasks_members): a workflow's.
TASK_COPY_TYPES_MEMBERS = (*TASK_COPY_TYPES_OPTIONS, "uuid")


def keeps_defaults(tasks: TaskColumns) -> bool:
    """Whether every task keeps LEAN_DEFAULTS and has no ETA: its load
    leaves those columns out (copy_tasks_lean). list.count compares in C: a
    check costs the load a few passes over five lists."""
    n = len(tasks.ids)
    return (
        tasks.etas.count(None) == n
        and tasks.costs.count(LEAN_COST) == n
        and tasks.max_attempts.count(LEAN_MAX_ATTEMPTS) == n
        and tasks.backoff_bases.count(LEAN_BACKOFF_BASE) == n
        and tasks.backoff_maxes.count(LEAN_BACKOFF_MAX) == n
    )


def copy_rows(
    tasks: TaskColumns,
    seqs: Sequence[int],
    queue_id: Mapping[str, int],
    tenant_id: Mapping[str, int],
    now: datetime,
    *extra: Iterable[Any],
    lean: bool = False,
) -> Iterator[tuple[Any, ...]]:
    """copy_tasks's rows (TASK_COPY_TYPES), the `extra` columns after theirs;
    with `lean`, copy_tasks_lean's (TASK_COPY_TYPES_LEAN) of tasks that keep
    the defaults (`keeps_defaults`)."""
    head = (
        tasks.ids,
        seqs,
        map(queue_id.__getitem__, tasks.queues),
        map(tenant_id.__getitem__, tasks.tenants),
        tasks.names,
        tasks.payloads,
    )
    if lean:
        return zip(*head, tasks.enqueued, tasks.tenants, strict=True)
    return zip(
        *head,
        tasks.costs,
        tasks.max_attempts,
        tasks.backoff_bases,
        tasks.backoff_maxes,
        _statuses(tasks.etas, now),
        tasks.etas,
        tasks.enqueued,
        tasks.tenants,
        *extra,
        strict=False,  # the statuses may be endless
    )


def _statuses(etas: list[datetime | None], now: datetime) -> Iterable[str]:
    """Each task's status as it enters: scheduled while its ETA is ahead of
    the transaction's time (insert_tasks says the same in SQL)."""
    if etas.count(None) == len(etas):
        return repeat("pending")  # the usual case: no task has an ETA
    return ["scheduled" if eta is not None and eta > now else "pending" for eta in etas]


def task_rows(
    numbered: Iterable[tuple[int, TaskEnvelope]],
    queue_id: Mapping[str, int],
    tenant_id: Mapping[str, int],
    now: datetime,
    options: bool = False,
    lean: bool = False,
) -> Iterator[tuple[Any, ...]]:
    """The rows `load` COPYs (`copy_rows`) of envelopes numbered with their
    sequence numbers: copy_tasks's (TASK_COPY_TYPES), or with `options`
    copy_tasks_options's (TASK_COPY_TYPES_OPTIONS). For COPYing them
    elsewhere (the benchmarks' baselines, which time it): made a row at a
    time, as cheap as a row can be made of an envelope; the same rows
    (tests/unit/test_task_columns.py). With `lean`, copy_tasks_lean's rows
    (TASK_COPY_TYPES_LEAN) of tasks that keep the defaults (`keeps_defaults`)."""
    if lean:
        for seq, t in numbered:
            yield (
                t.id,
                seq,
                queue_id[t.queue],
                tenant_id[t.tenant],
                t.name,
                t.payload,
                t.enqueued_at,
                t.tenant,
            )
        return
    pairs = list(numbered)
    statuses = _statuses([t.eta for _, t in pairs], now)
    for (seq, t), status in zip(pairs, statuses, strict=False):
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
            status,
            t.eta,
            t.enqueued_at,
            t.tenant,
        )
        yield (*row, t.priority, t.limit_key) if options else row
