"""A registered task, its enqueue options, and one run of it to enqueue.

The task's own arguments and the enqueue options never share a call: the
options go to `using`, the arguments to what it returns, typed with the
task function's signature.

    parse_pdf.using(tenant="alice", priority=5).enqueue("a.pdf", pages=3)
    await parse_pdf.using(tenant="alice").aenqueue("a.pdf")
    app.enqueue_many(parse_pdf.using(tenant="alice").prepare(p) for p in paths)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
)
from uuid import UUID

from rota.errors import ValidationError
from rota.model.calls import ArgumentCheck, TaskOptions
from rota.model.envelope import EnvelopeTemplate

if TYPE_CHECKING:
    import psycopg

P = ParamSpec("P")
Q = ParamSpec("Q")  # a join's arguments after the result it receives
R = TypeVar("R")

# A transaction to enqueue in (`connection=`): the task is written with the
# caller's work, visible if it commits, gone if it rolls back.
SyncConnection: TypeAlias = "psycopg.Connection[object]"
AsyncConnection: TypeAlias = "psycopg.AsyncConnection[object]"


@dataclass(frozen=True)
class Periodic:
    """A task enqueued on a cron schedule; it gets the tick (ISO time) as last argument."""

    schedule: str
    task: Task[Any, Any]
    tenant: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class TaskCall:
    """One task to enqueue: what `task.call(...)` returns, for `enqueue_many`."""

    name: str
    tenant: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    eta: datetime | None = None
    countdown: float | None = None
    cost: float | None = None
    idempotency_key: str | None = None
    priority: int | None = None  # within the tenant: 0 (default) to 9, higher first
    # The registered task it runs, when made from one (`Enqueue.prepare`).
    task: Task[Any, Any] | None = field(default=None, compare=False, repr=False)
    # A workflow's join or step: a result goes before `args` when it runs.
    receives: bool = False


class Enqueuer(Protocol):
    """What a task enqueues through (an `App`); tasks know no more of it."""

    def enqueue_many(
        self, calls: Iterable[TaskCall], connection: SyncConnection | None = None
    ) -> list[UUID]: ...

    async def aenqueue_many(
        self, calls: Iterable[TaskCall], connection: AsyncConnection | None = None
    ) -> list[UUID]: ...


class Task(Generic[P, R]):
    """A registered task. Calling it runs the function here and now; `using`
    sets the enqueue options of a run."""

    # Copied from the function (functools.update_wrapper), as a decorator's are.
    __name__: str
    __qualname__: str
    __wrapped__: Callable[P, R]

    def __init__(
        self, app: Enqueuer, fn: Callable[P, R], template: EnvelopeTemplate, options: TaskOptions
    ) -> None:
        functools.update_wrapper(self, fn)
        self.app = app
        self.fn = fn
        # Asked for every task a worker starts: inspected once.
        self.is_async = inspect.iscoroutinefunction(fn)
        self.name = template.name
        self.template = template  # name, queue and retry policy, checked
        self.options = options
        self.arguments = ArgumentCheck(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<rota.Task {self.name} queue={self.options.queue}>"

    def using(
        self,
        *,
        tenant: str,
        eta: datetime | None = None,
        countdown: float | None = None,
        cost: float | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        connection: SyncConnection | AsyncConnection | None = None,
    ) -> Enqueue[P]:
        """A run's enqueue options: `tenant` (who the run is for), when it may
        start (`eta` or `countdown` seconds), its `cost` in the tenant's share
        (the task's by default), an `idempotency_key` (a second enqueue with
        the same key and tenant is the same task), its `priority` (0-9, higher
        first, within the tenant), and a `connection` to enqueue in that
        psycopg transaction. Checked when the run is enqueued."""
        return Enqueue(self, (tenant, eta, countdown, cost, idempotency_key, priority), connection)


class Enqueue(Generic[P]):
    """A task with its enqueue options (`Task.using`), taking the task's
    arguments, as its function does."""

    __slots__ = ("_connection", "_options", "task")

    def __init__(
        self,
        task: Task[P, Any],
        # (tenant, eta, countdown, cost, idempotency_key, priority): a tuple,
        # the cheapest thing to make on every enqueue.
        options: tuple[str, datetime | None, float | None, float | None, str | None, int | None],
        connection: SyncConnection | AsyncConnection | None,
    ) -> None:
        self.task = task
        self._options = options
        self._connection = connection

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> TaskCall:
        """The run, not yet enqueued: for `app.enqueue_many` (which takes the
        transaction, if any, as its own `connection=`)."""
        if self._connection is not None:
            raise ValidationError(
                "prepare() makes a run for enqueue_many: pass connection= to enqueue_many"
            )
        return self._call(args, kwargs)

    def receiving(
        self: Enqueue[Concatenate[Any, Q]], *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskCall:
        """A workflow's join or chain step: its first argument is the result
        it receives (a list, after a group), given when it runs; these are
        the rest."""
        return dataclasses.replace(self.prepare(*args, **kwargs), receives=True)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> UUID:
        """Enqueues the run; returns its id once it is stored."""
        connection: Any = self._connection
        return self.task.app.enqueue_many([self._call(args, kwargs)], connection=connection)[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> UUID:
        """Enqueues the run from asyncio; returns its id once it is stored."""
        connection: Any = self._connection
        calls = [self._call(args, kwargs)]
        return (await self.task.app.aenqueue_many(calls, connection=connection))[0]

    def _call(self, args: tuple[object, ...], kwargs: dict[str, object]) -> TaskCall:
        task = self.task
        tenant, eta, countdown, cost, key, priority = self._options
        # Every field at once: a frozen dataclass's __init__ sets its 12
        # fields one object.__setattr__ at a time, about 1.5 µs of a
        # producer's every task; the result is the same TaskCall
        # (tests/unit/test_task_call.py holds the two ways together).
        call = _new(TaskCall)
        _set(
            call,
            "__dict__",
            {
                "name": task.name,
                "tenant": tenant,
                "args": args,
                "kwargs": kwargs,
                "queue": task.options.queue,
                "eta": eta,
                "countdown": countdown,
                "cost": cost,
                "idempotency_key": key,
                "priority": priority,
                "task": task,
                "receives": False,
            },
        )
        return call


_new = object.__new__
_set = object.__setattr__
