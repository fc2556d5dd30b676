"""`rota.App`: the task registry, shared by every part of rota, and the
enqueue API web apps use.

    app = rota.App.from_env()

    @app.task(queue="pdfs", max_attempts=5, backoff=2.0)
    def parse_pdf(path: str, pages: int = 0) -> None: ...

    parse_pdf.using(tenant="alice").enqueue("a.pdf", pages=3)   # -> task id
    await parse_pdf.using(tenant="alice").aenqueue("a.pdf")     # asyncio
    app.enqueue_many([parse_pdf.using(tenant="alice").prepare(p) for p in paths])
    app.enqueue("parse_pdf", ["a.pdf"], queue="pdfs", tenant="alice")  # by name
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NotRequired, Required, Self, TypedDict, Unpack, overload
from uuid import UUID

from rota.buffer.entries import TaskBatch
from rota.errors import ValidationError
from rota.model.calls import CallRules, TaskOptions, check_call, check_queue_allowed, task_id_of
from rota.model.envelope import envelope_template
from rota.model.limits import Limit
from rota.model.rules import (
    check_cost,
    check_priority,
    check_result_ttl,
    check_soft_timeout,
    check_task_name,
    check_tenant,
    check_timeout,
)
from rota.settings import Settings
from rota.task import (
    AsyncConnection,
    P,
    Periodic,
    R,
    SyncConnection,
    Task,
    TaskCall,
)

if TYPE_CHECKING:
    from rota.producer import AsyncProducer, Producer, ProducerCore
    from rota.result import Result
    from rota.workflow import Node, Workflow


def _utc_now() -> datetime:
    return datetime.now(UTC)


class TaskDeclaration(TypedDict, total=False):
    """A task's options where it is registered (`App.task`)."""

    name: str | None  # the function's name by default
    queue: str | None
    max_attempts: int | None
    backoff: float | None
    backoff_max: float | None
    timeout: float | None
    soft_timeout: float | None
    cost: float  # 1.0 by default
    priority: int  # 0 by default
    result_ttl: float | None
    limit: Limit | None


TASK_DECLARATION = frozenset(TaskDeclaration.__annotations__)


class CallOptions(TypedDict, total=False):
    """A run's options when it is enqueued by name (`App.enqueue`)."""

    tenant: Required[str]  # who the run is for
    queue: NotRequired[str | None]  # for a task not registered in this app
    eta: NotRequired[datetime | None]
    countdown: NotRequired[float | None]
    cost: NotRequired[float | None]
    idempotency_key: NotRequired[str | None]
    priority: NotRequired[int | None]


CALL_OPTIONS = frozenset(CallOptions.__annotations__)


class App:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodics: list[Periodic] = []
        # The producers are made on the first enqueue: workers and maintenance
        # load an app without the Redis client unless their tasks enqueue.
        self._core: ProducerCore | None = None
        self._producer: Producer | None = None
        self._aproducer: AsyncProducer | None = None
        # What enqueues take as now (the enqueue time, `countdown=`); the
        # in-memory queue of rota.testing moves it.
        self.clock: Callable[[], datetime] = _utc_now

    @classmethod
    def from_env(cls) -> App:
        """Settings from the ROTA_* environment variables."""
        return cls(Settings())

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...  # @app.task

    @overload
    def task(
        self, /, **declared: Unpack[TaskDeclaration]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self, fn: Callable[..., Any] | None = None, /, **declared: Unpack[TaskDeclaration]
    ) -> Any:
        """Registers a task (its options: `TaskDeclaration`). `backoff` is the first
        retry delay in seconds (it doubles per attempt, with jitter);
        `timeout` bounds one run (in the process pool, its process is
        killed then); `soft_timeout`, in the process pool, raises
        rota.SoftTimeLimitExceeded in the task; `priority` (0-9, higher
        first, within a tenant) is its runs' default; `result_ttl` keeps
        each run's return value (JSON) that many seconds after it
        succeeds, for `app.result(task_id)`; `limit` (a rota.Limit) caps
        its runs' concurrency and rate per key, over every tenant."""
        if not declared.keys() <= TASK_DECLARATION:
            unknown = ", ".join(declared.keys() - TASK_DECLARATION)
            raise TypeError(f"app.task() got unknown options: {unknown}")
        name, queue = declared.get("name"), declared.get("queue")
        max_attempts, backoff = declared.get("max_attempts"), declared.get("backoff")
        backoff_max, timeout = declared.get("backoff_max"), declared.get("timeout")
        soft_timeout, result_ttl = declared.get("soft_timeout"), declared.get("result_ttl")
        cost, priority = declared.get("cost", 1.0), declared.get("priority", 0)
        limit = declared.get("limit")

        def register(function: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name or function.__name__
            check_task_name(task_name)
            if task_name in self.tasks:
                raise ValidationError(f"a task named {task_name!r} is already registered")
            options = TaskOptions(
                queue=self.settings.default_queue if queue is None else queue,
                max_attempts=(
                    self.settings.default_max_attempts if max_attempts is None else max_attempts
                ),
                backoff=self.settings.default_backoff_seconds if backoff is None else backoff,
                backoff_max=(
                    self.settings.default_backoff_max_seconds
                    if backoff_max is None
                    else backoff_max
                ),
                timeout=check_timeout(timeout),
                soft_timeout=check_soft_timeout(soft_timeout, timeout),
                cost=cost,
                priority=check_priority(priority),
                result_ttl=None if result_ttl is None else check_result_ttl(result_ttl),
                limit=limit,
            )
            # Checked once here, so a bad option fails at import, not at enqueue.
            template = envelope_template(
                task_name, options.queue, options.max_attempts, options.backoff, options.backoff_max
            )
            check_queue_allowed(options.queue, self.settings.allowed_queues)
            check_cost(options.cost)
            registered: Task[Any, Any] = Task(self, function, template, options)
            if limit is not None:
                if not isinstance(limit, Limit):
                    raise ValidationError(f"limit= must be a rota.Limit, got {limit!r}")
                limit.check_fits(task_name, registered.arguments.signature)
            self.tasks[task_name] = registered
            return registered

        return register(fn) if fn is not None else register

    def periodic(
        self,
        schedule: str,
        *,
        tenant: str = "system",
        args: Sequence[Any] = (),
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
    ) -> Callable[[Callable[..., Any]], Task[Any, Any]]:
        """Registers a task and enqueues it on a cron schedule ("*/5 * * * *"),
        once per tick however many schedulers run."""
        from croniter import croniter

        if not croniter.is_valid(schedule):
            raise ValidationError(f"{schedule!r} is not a valid cron schedule")
        check_tenant(tenant)

        def register(function: Callable[..., Any]) -> Task[Any, Any]:
            registered: Task[Any, Any] = self.task(
                name=name, queue=queue, max_attempts=max_attempts
            )(function)
            self.periodics.append(Periodic(schedule, registered, tenant, tuple(args)))
            return registered

        return register

    # -- checking calls ------------------------------------------------------

    def batch(self, calls: Iterable[TaskCall], now: datetime | None = None) -> TaskBatch:
        """Checks calls and collects them into a batch, all or nothing (raises a
        ValidationError subclass saying which call was wrong)."""
        batch = TaskBatch(now or self.clock())
        tasks, rules, enqueued_at = self.tasks, CallRules.of(self.settings), batch.enqueued_at
        for call in calls:
            batch.append(check_call(call, tasks, rules, enqueued_at))
        return batch

    def check_queue_allowed(self, queue: str) -> None:
        """With ROTA_QUEUES set, only the queues it names may be used."""
        check_queue_allowed(queue, self.settings.allowed_queues)

    # -- enqueueing ----------------------------------------------------------

    def _producer_core(self) -> ProducerCore:
        """The decisions (breaker, capacity cache) the sync and async producers share."""
        from rota.producer import ProducerCore

        if self._core is None:
            self._core = ProducerCore(self.settings)
        return self._core

    @property
    def producer(self) -> Producer:
        from rota.producer import Producer

        if self._producer is None:
            self._producer = Producer(self.settings, self._producer_core())
        return self._producer

    @property
    def aproducer(self) -> AsyncProducer:
        from rota.producer import AsyncProducer

        if self._aproducer is None:
            self._aproducer = AsyncProducer(self.settings, self._producer_core())
        return self._aproducer

    def prepare(
        self,
        name: str,
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
        **options: Unpack[CallOptions],
    ) -> TaskCall:
        """One run of a task by name, for `enqueue_many`. The options
        (`CallOptions`): `tenant`, and `queue` for tasks that are not
        registered in this app; the others as for `Task.using`."""
        if "tenant" not in options or not options.keys() <= CALL_OPTIONS:
            raise TypeError(
                f"enqueue options: tenant (required), queue, eta, countdown, cost, "
                f"idempotency_key, priority; not {', '.join(options.keys() - CALL_OPTIONS)}"
            )
        # Positional, in TaskCall's field order: keyword arguments make this
        # frozen dataclass measurably slower to build, on every enqueue.
        return TaskCall(
            name,
            options["tenant"],
            args,
            dict(kwargs or {}),
            options.get("queue"),
            options.get("eta"),
            options.get("countdown"),
            options.get("cost"),
            options.get("idempotency_key"),
            options.get("priority"),
        )

    def enqueue(
        self,
        name: str,
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
        *,
        connection: SyncConnection | None = None,
        **options: Unpack[CallOptions],
    ) -> UUID:
        """Enqueues a run of a task by name (options as for `prepare`);
        returns its id once it is durably stored. With `connection=` (a
        psycopg connection), in that connection's transaction: visible if it
        commits, gone if it rolls back."""
        call = self.prepare(name, args, kwargs, **options)
        return self.enqueue_many([call], connection=connection)[0]

    async def aenqueue(
        self,
        name: str,
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
        *,
        connection: AsyncConnection | None = None,
        **options: Unpack[CallOptions],
    ) -> UUID:
        """`enqueue` for asyncio."""
        call = self.prepare(name, args, kwargs, **options)
        return (await self.aenqueue_many([call], connection=connection))[0]

    def enqueue_many(
        self, calls: Iterable[TaskCall], connection: SyncConnection | None = None
    ) -> list[UUID]:
        """Enqueues many runs at once (all checked before anything is written)."""
        return self.producer.store(self.batch(calls), connection)

    async def aenqueue_many(
        self, calls: Iterable[TaskCall], connection: AsyncConnection | None = None
    ) -> list[UUID]:
        return await self.aproducer.store(self.batch(calls), connection)

    def task_id_of(self, call: TaskCall) -> UUID | None:
        """The id an idempotency key gives (None: a new one)."""
        return task_id_of(call)

    def enqueue_workflow(self, flow: Node, connection: SyncConnection | None = None) -> Workflow:
        """Stores a workflow (`rota.chain`, `rota.group`, `.then`) straight in
        PostgreSQL in one transaction (with `connection=`, the caller's, as
        enqueue_many does): all of it, or, for a bad graph, nothing (a
        ValidationError says why)."""
        from rota.workflow import enqueue

        return enqueue(self, flow, connection)

    async def aenqueue_workflow(
        self, flow: Node, connection: AsyncConnection | None = None
    ) -> Workflow:
        from rota.workflow import aenqueue

        return await aenqueue(self, flow, connection)

    def result(self, task_id: UUID) -> Result:
        """The result of the task with this id (what enqueue returned):
        `status()`, `get(timeout=)`, `await aget(timeout=)`."""
        from rota.result import Result

        return Result(self.settings, task_id)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()

    async def aclose(self) -> None:
        if self._aproducer is not None:
            await self._aproducer.close()
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def load_app(spec: str) -> App:
    """The App that `package.module:attribute` names (ValueError if none)."""
    from rota.runtime.process import load_object

    found = load_object(spec)
    if not isinstance(found, App):
        raise ValueError(f"{spec} is a {type(found).__name__}, not a rota.App")
    return found
