"""Loading checked tasks in chunks, each its own transaction, with the
culprits of a refused chunk found and set aside: one function for the
Python loader, the Spark loader and `rota import`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from rota import core
from rota.buffer.streams import Rejected
from rota.core import db
from rota.core.db import Op
from rota.model.envelope import TaskEnvelope
from rota.runtime import tracing

K = TypeVar("K")


def load_entries(
    conn: psycopg.Connection[Any], entries: list[tuple[K, list[TaskEnvelope]]], size: int
) -> tuple[int, list[tuple[K, Rejected]]]:
    """Loads the tasks of buffer entries, in order (`load_in_chunks`). Returns
    the tasks stored, and each task PostgreSQL refused as a dead letter with
    the entry (`K`) it came from."""
    good = [envelope for _, envelopes in entries for envelope in envelopes]
    with tracing.load(len(good), (envelope.payload for envelope in good)):
        stored, refused = load_in_chunks(conn, good, size)
    if not refused:
        return stored, []
    # Rare: only then is it worth mapping tasks to their entries.
    origin = {envelope.id: key for key, envelopes in entries for envelope in envelopes}
    return stored, [(origin[e.id], Rejected(e.to_json(), reason)) for e, reason in refused]


def load_in_chunks(
    conn: psycopg.Connection[Any], envelopes: list[TaskEnvelope], size: int
) -> tuple[int, list[tuple[TaskEnvelope, str]]]:
    """Loads in chunks of `size`, each its own transaction (`load_ranges`).
    Returns (tasks stored, refused tasks with the reason)."""
    stored, refused = load_ranges(
        conn, len(envelopes), size, lambda start, stop: core.load(envelopes[start:stop])
    )
    return stored, [(envelopes[place], reason) for place, reason in refused]


def load_ranges(
    conn: psycopg.Connection[Any], count: int, size: int, load: Callable[[int, int], Op[int]]
) -> tuple[int, list[tuple[int, str]]]:
    """Loads `count` tasks, those from `start` to `stop` by `load(start, stop)`,
    in chunks of `size`, each its own transaction (a savepoint inside the
    caller's). A chunk the database refuses for its data (not for being down)
    is split until the culprits are found. Returns (tasks stored, refused
    tasks' places with the reason)."""
    stored = 0
    refused: list[tuple[int, str]] = []
    # In order, first chunk first: a tenant's tasks take their places in line
    # in the order they were enqueued.
    chunks = deque((start, min(start + size, count)) for start in range(0, count, size))
    while chunks:
        start, stop = chunks.popleft()
        try:
            stored += db.transact(conn, load(start, stop))
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            if stop - start == 1:
                refused.append((start, f"refused by PostgreSQL: {exc}"))
            else:
                half = (start + stop) // 2
                chunks.extendleft([(half, stop), (start, half)])
    return stored, refused
