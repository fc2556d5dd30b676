"""A registered task, its options, and one call of it to enqueue."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, ParamSpec, Protocol, TypeVar
from uuid import UUID

from rota.errors import ValidationError
from rota.model.envelope import EnvelopeTemplate

P = ParamSpec("P")
R = TypeVar("R")

# Keyword names that are enqueue options, not task arguments.
RESERVED = frozenset(
    {"tenant", "eta", "countdown", "cost", "idempotency_key", "connection", "priority"}
)


@dataclass(frozen=True)
class TaskOptions:
    queue: str
    max_attempts: int
    backoff: float
    backoff_max: float
    timeout: float | None
    cost: float
    priority: int = 0


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


# Distinct call shapes whose verdict a task remembers; past it, new shapes
# are checked on every call (a caller varying its keywords endlessly).
MAX_SHAPES = 1024


class ArgumentCheck:
    """Checks a call's arguments against the task function's signature, at
    enqueue rather than in a worker three attempts later. Calls of one shape
    (number of arguments, keyword names) share one verdict."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.signature = inspect.signature(fn)
        self._verdicts: dict[int | tuple[int, tuple[str, ...]], str | None] = {}

    def check(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        try:
            # Positional calls (most) are known by their length alone.
            shape: int | tuple[int, tuple[str, ...]] = (
                (len(args), tuple(kwargs)) if kwargs else len(args)
            )
        except TypeError:
            return  # not a list and a dict: the payload check says so
        verdict = self._verdicts.get(shape, False)
        if verdict is False:
            count, names = shape if isinstance(shape, tuple) else (shape, ())
            try:
                self.signature.bind(*range(count), **dict.fromkeys(names))
                verdict = None
            except TypeError as exc:
                verdict = str(exc)
            if len(self._verdicts) < MAX_SHAPES:
                self._verdicts[shape] = verdict
        if verdict is not None:
            raise ValidationError(f"arguments do not fit task {name!r}: {verdict}")


class Enqueuer(Protocol):
    """What a task enqueues through (an `App`); tasks know no more of it."""

    def enqueue_many(self, calls: Iterable[TaskCall], connection: Any = None) -> list[UUID]: ...

    async def aenqueue_many(
        self, calls: Iterable[TaskCall], connection: Any = None
    ) -> list[UUID]: ...


class Task(Generic[P, R]):
    """A registered task. Calling it runs the function here and now."""

    def __init__(
        self, app: Enqueuer, fn: Callable[P, R], template: EnvelopeTemplate, options: TaskOptions
    ) -> None:
        self.app = app
        self.fn = fn
        # Asked for every task a worker starts: inspected once.
        self.is_async = inspect.iscoroutinefunction(fn)
        self.name = template.name
        self.template = template  # name, queue and retry policy, checked
        self.options = options
        self.arguments = ArgumentCheck(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<rota.Task {self.name} queue={self.options.queue}>"

    def call(
        self,
        *args: Any,
        tenant: str,
        eta: datetime | None = None,
        countdown: float | None = None,
        cost: float | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> TaskCall:
        return TaskCall(
            self.name,
            tenant,
            args,
            kwargs,
            self.options.queue,
            eta,
            countdown,
            cost,
            idempotency_key,
            priority,
        )

    def enqueue(self, *args: Any, connection: Any = None, **options: Any) -> UUID:
        """Enqueues one run: arguments and options (`tenant=`, `eta=`/`countdown=`,
        `cost=`, `idempotency_key=`, `priority=`) as for `call`; returns the task id once the
        task is stored. `connection=`: in that psycopg transaction."""
        return self.app.enqueue_many([self.call(*args, **options)], connection=connection)[0]

    async def aenqueue(self, *args: Any, connection: Any = None, **options: Any) -> UUID:
        calls = [self.call(*args, **options)]
        return (await self.app.aenqueue_many(calls, connection=connection))[0]
