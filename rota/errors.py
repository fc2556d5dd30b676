"""rota's exceptions: every error a caller can act on has its own type."""

from __future__ import annotations


class RotaError(Exception):
    """Base of every rota error."""


class ValidationError(RotaError, ValueError):
    """A task, name or setting was rejected before anything was written."""


class InvalidName(ValidationError):
    """A queue, tenant or task name breaks the documented rules."""


class PayloadTooLarge(ValidationError):
    """The task's serialised arguments exceed the configured size cap."""


class NotJSONSerializable(ValidationError):
    """The task's arguments cannot be represented as JSON."""


class UnknownTask(ValidationError):
    """No task of that name is registered."""


class CapacityExceeded(RotaError):
    """The tenant has as much work waiting as its capacity allows (backpressure)."""

    def __init__(self, tenant: str, backlog: float, capacity: int) -> None:
        super().__init__(
            f"tenant {tenant!r} has {backlog:g} units of work waiting, its capacity is {capacity}"
        )
        self.tenant = tenant
        self.backlog = backlog
        self.capacity = capacity


class EnqueueError(RotaError):
    """Neither the Redis buffer nor PostgreSQL could store the task: nothing was stored."""


class Retry(RotaError):
    """Raised inside a task to run it again later, on purpose.

    It uses an attempt like any failure; after the last one the task is dead."""

    def __init__(self, countdown: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.countdown = countdown
        self.reason = reason


class OutsideTask(RotaError):
    """`rota.context()` was called outside a running task."""


class Cancelled(RotaError):
    """Raised by `rota.context().raise_if_cancelled()` in a task whose cancel
    was asked: the task ends cancelled, not retried."""


class SoftTimeLimitExceeded(RotaError):
    """Raised inside a task of the process pool at its `soft_timeout`: time to
    clean up before its `timeout` kills it."""


class ResultError(RotaError):
    """A task's result cannot be given; the subclass says why."""

    def __init__(self, task_id: object, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class TaskFailed(ResultError):
    """The task is dead: it failed its last attempt (or could not run)."""

    def __init__(self, task_id: object, error: str | None, traceback: str | None) -> None:
        super().__init__(task_id, f"task {task_id} is dead: {error or 'no error kept'}")
        self.error = error
        self.traceback = traceback


class TaskCancelled(ResultError):
    """The task was cancelled before it succeeded."""


class ResultExpired(ResultError):
    """The task succeeded, and its result was dropped when its result_ttl ended."""


class ResultNotKept(ResultError):
    """The task succeeded, but no result is kept for it: its task keeps none
    (no result_ttl), or the result was refused (too big, not JSON), said in
    the message."""
