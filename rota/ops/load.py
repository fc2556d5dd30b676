"""Producers and loaders: tasks into the tables, each at its fair place in
line (docs/architecture.md, "Fairness")."""

from __future__ import annotations

from collections.abc import Iterable

from rota.db import Execute, Op, UUIDArray
from rota.envelope import TaskEnvelope
from rota.sql import query


def load(envelopes: Iterable[TaskEnvelope]) -> Op[int]:
    """Loads tasks at their fair places in line, in one statement
    (rota.load_tasks, which computes the places: docs/architecture.md,
    "Fairness"). Tasks loaded or run before (same id) are ignored. Returns how
    many were new."""
    tasks = _first_of_each_id(envelopes)
    if not tasks:
        return 0
    etas = [t.eta for t in tasks]
    rows = yield Execute(
        query("load_tasks"),
        {
            "ids": UUIDArray(t.id for t in tasks),
            "queues": [t.queue for t in tasks],
            "tenants": [t.tenant for t in tasks],
            "names": [t.name for t in tasks],
            "payloads": [t.payload for t in tasks],
            "costs": [float(t.cost) for t in tasks],
            "max_attempts": [t.max_attempts for t in tasks],
            "backoff_bases": [float(t.backoff_base) for t in tasks],
            "backoff_maxes": [float(t.backoff_max) for t in tasks],
            # No ETA at all (the usual case): an empty array, as the
            # unnest pads it with NULLs; a list of Nones has no type to send.
            "etas": etas if any(e is not None for e in etas) else [],
            "enqueued_ats": [t.enqueued_at for t in tasks],
        },
    )
    return int(rows[0][0])


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


def tenant_backlogs() -> Op[dict[str, tuple[int, float]]]:
    """{tenant: (capacity, estimated waiting work)} of the tenants that have a
    capacity, for backpressure."""
    rows = yield Execute(query("tenant_backlog"))
    return {row[0]: (row[1], float(row[2])) for row in rows}


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
