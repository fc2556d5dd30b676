"""The running task's context: `rota.context()` inside a task, in a worker
or under `rota.testing`."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from uuid import UUID

from rota.errors import RotaError

if TYPE_CHECKING:
    from rota.core import ClaimedTask

# Set by the worker (and rota.testing) around each run; a task's own asyncio
# tasks and threads started with contextvars.copy_context see it too.
current_task: contextvars.ContextVar[ClaimedTask] = contextvars.ContextVar("rota_task")


class OutsideTask(RotaError):
    """`rota.context()` was called outside a running task."""


@dataclass(frozen=True)
class TaskContext:
    """What a running task knows of itself."""

    id: UUID
    name: str
    tenant: str
    queue: str
    attempt: int  # 1 on the first run
    max_attempts: int
    enqueued_at: datetime
    lease_expires_at: datetime  # the worker extends it while the task runs

    @property
    def is_last_attempt(self) -> bool:
        """A failure now is final: the task is dead-lettered, not retried."""
        return self.attempt >= self.max_attempts


def context() -> TaskContext:
    """The running task's context; raises OutsideTask elsewhere."""
    task = current_task.get(None)
    if task is None:
        raise OutsideTask("rota.context() is called from outside a running task")
    return TaskContext(
        id=task.id,
        name=task.name,
        tenant=task.tenant,
        queue=task.queue,
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        enqueued_at=task.enqueued_at,
        lease_expires_at=task.lease_expires_at,
    )
