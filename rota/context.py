"""The running task's context: `rota.context()` inside a task, in a worker
or under `rota.testing`."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from rota.errors import Cancelled, OutsideTask
from rota.model.progress import check_progress
from rota.runtime.current import CancelFlag, current_cancel, current_task
from rota.runtime.progress import ProgressSlot, current_progress

if TYPE_CHECKING:
    from rota.task import Enqueue, P, Task


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
    _cancel: CancelFlag | None = field(default=None, repr=False, compare=False)
    _progress: ProgressSlot | None = field(default=None, repr=False, compare=False)

    @property
    def is_last_attempt(self) -> bool:
        """A failure now is final: the task is dead-lettered, not retried."""
        return self.attempt >= self.max_attempts

    @property
    def cancelled(self) -> bool:
        """Whether this run's cancel was asked: a sync task should stop (an
        async one is cancelled by its worker, a CancelledError at its await)."""
        return self._cancel is not None and self._cancel.asked

    def child(self, task: Task[P, Any], **options: Any) -> Enqueue[P]:
        """`task.using(...)` for a child of this run: its tenant's, with the
        other enqueue options given (`rota.context().child(index).enqueue(page)`)."""
        return task.using(tenant=self.tenant, **options)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Reports how far the task got: `done` of `total` (None: no total
        known), with an optional message, for `app.result(id).progress()`,
        `rota task show` and the console. Cheap enough for a tight loop: the
        worker stores the latest values at most about once a second, and keeps
        the last after the task ends.

        Raises ValidationError (and stores nothing) for a number that is not
        finite and non-negative, `done` above `total`, or a message that is
        not a str; a message over 500 characters is cut to 500, its last an
        ellipsis. Under `rota.testing` the values are checked, not kept."""
        values = check_progress(done, total, message)
        if self._progress is not None:
            self._progress.report(values)

    def raise_if_cancelled(self) -> None:
        """Raises Cancelled once this run's cancel was asked."""
        if self.cancelled:
            raise Cancelled(f"task {self.id} was cancelled while it ran")


# The context last made in this context (of asyncio, of a thread): made once
# per run, so that `rota.context()` in a tight loop costs three lookups.
_made: contextvars.ContextVar[tuple[object, object, object, TaskContext]] = contextvars.ContextVar(
    "rota_context"
)


def context() -> TaskContext:
    """The running task's context; raises OutsideTask elsewhere."""
    task = current_task.get(None)
    if task is None:
        raise OutsideTask("rota.context() is called from outside a running task")
    cancel, progress = current_cancel.get(None), current_progress.get(None)
    made = _made.get(None)
    if made is not None and made[0] is task and made[1] is cancel and made[2] is progress:
        return made[3]
    found = TaskContext(
        id=task.id,
        name=task.name,
        tenant=task.tenant,
        queue=task.queue,
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        enqueued_at=task.enqueued_at,
        lease_expires_at=task.lease_expires_at,
        _cancel=cancel,
        _progress=progress,
    )
    _made.set((task, cancel, progress, found))
    return found
