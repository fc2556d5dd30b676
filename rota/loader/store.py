"""Loading checked tasks in chunks, each its own transaction, with the
culprits of a refused chunk found and set aside: one function for the
Python loader, the Spark loader, `rota import` and the replay of dead
letters, each handing it one load's columns (rota.core.load.TaskColumns)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg

from rota import core
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import Rejected
from rota.core import db
from rota.core.db import UUIDArray
from rota.core.load import TaskColumns
from rota.runtime import tracing

K = TypeVar("K")


def batch_columns(batches: Sequence[TaskBatch]) -> TaskColumns:
    """The batches' tasks, in order, as one load's columns, read from the
    batches' own columns: no envelope is made per task."""
    columns: dict[str, Any] = {field: [] for field in (*_OWN, *_SHARED, "enqueued")}
    columns["ids"] = UUIDArray()
    for batch in batches:
        for field in _OWN:
            columns[field] += getattr(batch, field)
        columns["enqueued"] += [batch.enqueued_at] * len(batch.ids)
        templates = [t.as_row() for t in batch.templates]  # name, queue, retry policy
        for place, field in enumerate(_SHARED):
            if len(templates) == 1:  # the usual case: one task's runs
                columns[field] += [templates[0][place]] * len(batch.ids)
            else:
                values = [row[place] for row in templates]
                columns[field] += [values[i] for i in batch.template]
    return TaskColumns(**columns)


# The columns a batch has of each task (named as a load's), and those its
# template gives (in EnvelopeTemplate.as_row's order).
_OWN = ("ids", "tenants", "payloads", "costs", "etas", "priorities", "limit_keys")
_SHARED = ("names", "queues", "max_attempts", "backoff_bases", "backoff_maxes")


def load_entries(
    conn: psycopg.Connection[Any], entries: Sequence[tuple[K, TaskBatch]], size: int
) -> tuple[int, list[tuple[K, Rejected]]]:
    """Loads the tasks of buffer entries, in order (`load_in_chunks`). Returns
    the tasks stored, and each task PostgreSQL refused as a dead letter with
    the entry (`K`) it came from."""
    tasks = batch_columns([batch for _, batch in entries])
    with tracing.load(len(tasks), tasks.payloads):
        stored, refused = load_in_chunks(conn, tasks, size)
    if not refused:
        return stored, []
    # Rare: only then is it worth mapping tasks to their entries.
    origin = [key for key, batch in entries for _ in batch.ids]
    return stored, [
        (origin[place], Rejected(tasks.envelope(place).to_json(), reason))
        for place, reason in refused
    ]


def load_in_chunks(
    conn: psycopg.Connection[Any], tasks: TaskColumns, size: int
) -> tuple[int, list[tuple[int, str]]]:
    """Loads the tasks (core.load) in chunks of `size`, each its own
    transaction (a savepoint inside the caller's). A chunk the database
    refuses for its data (not for being down) is split until the culprits
    are found. Returns (tasks stored, refused tasks' places with the reason)."""
    stored = 0
    refused: list[tuple[int, str]] = []
    count = len(tasks)
    # In order, first chunk first: a tenant's tasks take their places in line
    # in the order they were enqueued.
    chunks = deque((start, min(start + size, count)) for start in range(0, count, size))
    while chunks:
        start, stop = chunks.popleft()
        try:
            stored += db.transact(conn, core.load(tasks.part(slice(start, stop))))
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            if stop - start == 1:
                refused.append((start, f"refused by PostgreSQL: {exc}"))
            else:
                half = (start + stop) // 2
                chunks.extendleft([(half, stop), (start, half)])
    return stored, refused
