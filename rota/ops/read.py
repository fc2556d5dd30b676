"""The read model: what operators and scripts see."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from rota.db import Execute, Op, Row, UUIDArray
from rota.sql import query


@dataclass(frozen=True)
class TaskState:
    id: UUID
    queue: str
    tenant: str
    status: str  # pending, running, scheduled, succeeded or dead
    attempts: int
    last_error: str | None
    finished_at: datetime | None


def task_states(task_ids: Sequence[UUID]) -> Op[dict[UUID, TaskState]]:
    rows: list[Row] = yield Execute(query("task_state"), {"ids": UUIDArray(task_ids)})
    return {row[0]: TaskState(*row) for row in rows}


def queue_counts() -> Op[dict[str, dict[str, int]]]:
    rows = yield Execute(query("queue_counts"))
    return {row[0]: {"ready": row[1], "running": row[2], "scheduled": row[3]} for row in rows}
