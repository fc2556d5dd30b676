"""Progress of running tasks: stored by their workers in one statement per
flush (at most about once a second), read by their waiters and operators."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from rota.core.db import Op, UUIDArray, first, select, values
from rota.core.rows import Rows
from rota.core.work import WorkerKey, _as
from rota.model.progress import Progress, Values
from rota.sql import query


def report_progress(
    reports: Sequence[tuple[tuple[UUID, int], Values]], as_worker: WorkerKey | None = None
) -> Op[set[UUID]]:
    """Stores the latest progress of tasks by their attempt tokens; returns the
    ids stored (a stale token is refused: its worker holds the task no more)."""
    ids, attempts, done, totals, messages = UUIDArray(), [], [], [], []
    for (task_id, attempt), (done_, total, message) in reports:
        ids.append(task_id)
        attempts.append(attempt)
        done.append(done_)
        totals.append(total)
        messages.append(message)
    params = {
        "ids": ids,
        "attempts": attempts,
        "done": done,
        "totals": totals,
        "messages": messages,
    }
    statement = _as(as_worker, query("report_progress"), query("worker_report_progress"), params)
    return set((yield from values(*statement)))


def _progress(
    attempt: int, done: float, total: float | None, message: str | None, reported_at: datetime
) -> Progress:
    return Progress(done, total, message, reported_at, attempt)


def task_progress(task_id: UUID) -> Op[Progress | None]:
    """A task's last progress; None when it reported none (or its record is gone)."""
    return first(query("task_progress"), {"id": task_id}, Rows(_progress))


def _keyed(
    task_id: UUID,
    attempt: int,
    done: float,
    total: float | None,
    message: str | None,
    reported_at: datetime,
) -> tuple[UUID, Progress]:
    return task_id, Progress(done, total, message, reported_at, attempt)


def progress_of(task_ids: Sequence[UUID]) -> Op[dict[UUID, Progress]]:
    """The last progress of those of these tasks that reported one."""
    if not task_ids:
        return {}
    rows = yield from select(query("progress_of"), {"ids": UUIDArray(task_ids)}, Rows(_keyed))
    return dict(rows)
