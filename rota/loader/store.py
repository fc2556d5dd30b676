"""Loading checked tasks in chunks, each its own transaction, with the
culprits of a refused chunk found and set aside: one function for the
Python loader, the Spark loader and `rota import`."""

from __future__ import annotations

from collections import deque
from typing import Any, TypeVar

import psycopg

from rota import core
from rota.buffer.streams import Rejected
from rota.core import db
from rota.model.envelope import TaskEnvelope

K = TypeVar("K")


def load_entries(
    conn: psycopg.Connection[Any], entries: list[tuple[K, list[TaskEnvelope]]], size: int
) -> tuple[int, list[tuple[K, Rejected]]]:
    """Loads the tasks of buffer entries, in order (`load_in_chunks`). Returns
    the tasks stored, and each task PostgreSQL refused as a dead letter with
    the entry (`K`) it came from."""
    good = [envelope for _, envelopes in entries for envelope in envelopes]
    stored, refused = load_in_chunks(conn, good, size)
    if not refused:
        return stored, []
    # Rare: only then is it worth mapping tasks to their entries.
    origin = {envelope.id: key for key, envelopes in entries for envelope in envelopes}
    return stored, [(origin[e.id], Rejected(e.to_json(), reason)) for e, reason in refused]


def load_in_chunks(
    conn: psycopg.Connection[Any], envelopes: list[TaskEnvelope], size: int
) -> tuple[int, list[tuple[TaskEnvelope, str]]]:
    """Loads in chunks of `size`, each its own transaction (a savepoint inside
    the caller's). A chunk the database refuses for its data (not for being
    down) is split until the culprits are found. Returns (tasks stored, refused
    tasks with the reason)."""
    stored = 0
    refused: list[tuple[TaskEnvelope, str]] = []
    # In order, first chunk first: a tenant's tasks take their places in line
    # in the order they were enqueued.
    chunks = deque(envelopes[i : i + size] for i in range(0, len(envelopes), size))
    while chunks:
        chunk = chunks.popleft()
        try:
            stored += db.transact(conn, core.load(chunk))
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            if len(chunk) == 1:
                refused.append((chunk[0], f"refused by PostgreSQL: {exc}"))
            else:
                half = len(chunk) // 2
                chunks.extendleft([chunk[half:], chunk[:half]])
    return stored, refused
