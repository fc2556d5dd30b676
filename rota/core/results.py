"""Results: kept with the completion of the tasks that ask for them, read by
their waiters (`rota.App.result`), pruned when they expire."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from rota.core.db import Execute, Op, UUIDArray, first, value, values
from rota.core.rows import Rows
from rota.core.work import (
    RunTimes,
    Settled,
    WorkerKey,
    _as,
    completion_params,
    settle_and_claim,
)
from rota.sql import query


class KeptResult(NamedTuple):
    """A completed task's result to keep: its JSON, or why none is kept (a
    tuple: one is made per task on the worker's hot path)."""

    token: tuple[UUID, int]
    json: str | None  # the return value as JSON text
    refused: str | None  # why it is not kept (too big, not JSON)
    ttl_seconds: float


def _keeping(
    done: Sequence[tuple[UUID, int]],
    kept: Sequence[KeptResult],
    runs: Mapping[UUID, RunTimes] | None,
) -> dict[str, Any]:
    """The parameters of completions (`done`, keeping no result, first) and
    of completions that keep their results (`kept`), with their runs'
    measures (`runs`, by task id)."""
    none: list[None] = [None] * len(done)
    tokens, values, refused, ttls = zip(*kept, strict=True) if kept else ((), (), (), ())
    return {
        **completion_params([*done, *tokens], runs),
        "values": [*none, *values],
        "refused": [*none, *refused],
        "ttls": [*none, *ttls],
    }


def complete_keeping(
    kept: Sequence[KeptResult],
    as_worker: WorkerKey | None = None,
    runs: Mapping[UUID, RunTimes] | None = None,
) -> Op[set[UUID]]:
    """Completes claimed tasks, keeping their results, in one transaction;
    returns the ids completed (a stale token is refused, its result with it).
    Their waiters are woken. `runs`: as `core.complete` takes them."""
    params = _keeping((), kept, runs)
    statement = _as(as_worker, query("complete_keeping"), query("worker_complete_keeping"), params)
    return set((yield from values(*statement)))


def complete_keeping_and_claim(
    done: Sequence[tuple[UUID, int]],
    kept: Sequence[KeptResult],
    queues: Sequence[str],
    limit: int,
    worker: str | WorkerKey,
    lease_seconds: float = 60.0,
    runs: Mapping[UUID, RunTimes] | None = None,
) -> Op[Settled]:
    """`core.complete_and_claim` for completions some of which keep results
    (`kept`): one statement, one transaction."""
    claiming = query("complete_keeping_claim"), query("worker_complete_keeping_claim")
    reports = _keeping(done, kept, runs)
    return settle_and_claim(claiming, reports, queues, limit, worker, lease_seconds)


def wake_result_waiters(task_ids: Sequence[UUID]) -> Op[None]:
    """Wakes the waiters of tasks that ended without a result (dead, cancelled)."""
    yield from values(query("wake_result_waiters"), {"ids": UUIDArray(task_ids)})


@dataclass(frozen=True)
class ResultState:
    """What became of a task, as its result's waiter reads it."""

    status: str  # pending, scheduled, running, succeeded, dead or cancelled
    value: str | None  # the result's JSON text
    refused: str | None
    kept: bool  # a result (or its refusal) is kept, unexpired
    error: str | None
    traceback: str | None
    finished_at: datetime | None
    expires_at: datetime | None


def task_result(task_id: UUID) -> Op[ResultState | None]:
    """The task's state and result; None when PostgreSQL has no trace of it
    (still in the buffer, pruned, or no such task)."""
    return first(query("task_result"), {"id": task_id}, Rows(ResultState))


def prune_results(limit: int = 10_000) -> Op[int]:
    """Drops up to `limit` expired results."""
    return int((yield from value(query("prune_results"), {"limit": limit})))


def listen_results() -> Op[None]:
    """Subscribes the connection to the NOTIFY of ended tasks with waiters."""
    yield Execute(query("listen_results"))
