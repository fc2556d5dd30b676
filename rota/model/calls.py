"""One run to enqueue, checked in one place and in one pass: the task's name
and arguments, its queue (and ROTA_QUEUES), its limit's key, the tenant,
cost, time, payload and priority, and the id an idempotency key gives.

`check_call` takes everything it needs as arguments (the app's registered
tasks and its rules for calls); the App, a workflow and rota.testing build
their batches with it; TaskBatch.add checks one run of a template with
`run_of`.
A registered task's own options are checked once, where it is declared.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from uuid import UUID

from rota.errors import UnknownTask, ValidationError
from rota.model.envelope import EnvelopeTemplate, check_run, envelope_template, task_id_for_key
from rota.model.limits import Limit
from rota.model.rules import (
    check_idempotency_key,
    check_limit_key,
    check_priority,
    check_task_name,
    check_tenant,
    resolve_eta,
)

if TYPE_CHECKING:
    from rota.settings import Settings


@dataclass(frozen=True)
class TaskOptions:
    """A registered task's options, checked where it is declared."""

    queue: str
    max_attempts: int
    backoff: float
    backoff_max: float
    timeout: float | None  # seconds a run may take (the process pool kills it then)
    cost: float
    priority: int = 0
    result_ttl: float | None = None  # seconds a run's return value is kept (None: not kept)
    # Seconds until the process pool raises SoftTimeLimitExceeded in a run.
    soft_timeout: float | None = None
    # The limit on keys its runs count against (rota.Limit), if any.
    limit: Limit | None = None


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


class Registered(Protocol):
    """What a registered task (rota.Task) brings to its calls' checks."""

    @property
    def template(self) -> EnvelopeTemplate: ...  # name, queue and retry policy, checked

    @property
    def options(self) -> TaskOptions: ...

    @property
    def arguments(self) -> ArgumentCheck: ...


class Call(Protocol):
    """One run to enqueue, as the caller gave it (rota.TaskCall)."""

    @property
    def name(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def args(self) -> Sequence[Any]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def queue(self) -> str | None: ...
    @property
    def eta(self) -> datetime | None: ...
    @property
    def countdown(self) -> float | None: ...
    @property
    def cost(self) -> float | None: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def receives(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class CallRules:
    """What an app's settings say of every call: the defaults of a task not
    registered in it, the queues it may use, the payload's bound."""

    queue: str
    max_attempts: int
    backoff: float
    backoff_max: float
    allowed_queues: frozenset[str] | None
    max_payload_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> CallRules:
        return cls(
            settings.default_queue,
            settings.default_max_attempts,
            settings.default_backoff_seconds,
            settings.default_backoff_max_seconds,
            settings.allowed_queues,
            settings.max_payload_bytes,
        )


class CheckedRun(NamedTuple):
    """One run, checked: what TaskBatch.append stores."""

    template: EnvelopeTemplate
    tenant: str
    payload: str  # the arguments' JSON
    task_id: UUID | None  # None: a new one
    cost: float
    eta: datetime | None
    priority: int
    limit_key: str | None


def check_queue_allowed(queue: str, allowed: frozenset[str] | None) -> None:
    """With ROTA_QUEUES set (`allowed`), only the queues it names may be used."""
    if allowed is not None and queue not in allowed:
        raise ValidationError(
            f"queue {queue!r} is not in ROTA_QUEUES ({', '.join(sorted(allowed))})"
        )


def task_id_of(call: Call) -> UUID | None:
    """The id an idempotency key gives (None: a new one)."""
    if call.idempotency_key is None:
        return None
    return task_id_for_key(check_idempotency_key(call.idempotency_key), check_tenant(call.tenant))


def run_of(
    template: EnvelopeTemplate,
    tenant: Any,
    args: Any = (),
    kwargs: Any = None,
    task_id: UUID | None = None,
    cost: Any = 1.0,
    eta: Any = None,
    max_payload_bytes: int = 256 * 1024,
    priority: Any = 0,
    limit_key: str | None = None,
) -> CheckedRun:
    """One run of a checked template, with what it carries of its own checked
    (tenant, cost, time, arguments, priority, limit key); raises a
    ValidationError subclass."""
    if limit_key is not None:
        check_limit_key(limit_key)
    return _run(
        template, tenant, args, kwargs, task_id, cost, eta, max_payload_bytes, priority, limit_key
    )


def _run(
    template: EnvelopeTemplate,
    tenant: Any,
    args: Any,
    kwargs: Any,
    task_id: UUID | None,
    cost: Any,
    eta: Any,
    max_payload_bytes: int,
    priority: Any,
    limit_key: str | None,  # checked
) -> CheckedRun:
    tenant, cost, eta, payload = check_run(tenant, cost, eta, args, kwargs, max_payload_bytes)
    priority = check_priority(priority)
    return CheckedRun(template, tenant, payload, task_id, cost, eta, priority, limit_key)


def check_call(
    call: Call,
    tasks: Mapping[str, Registered],
    rules: CallRules,
    now: datetime,
    task_id: UUID | None = None,
    eta: datetime | None = None,
) -> CheckedRun:
    """Checks one call of a task registered in `tasks` (or, with `queue=`,
    of one defined elsewhere, with `rules`' defaults); returns the run to
    store, with `task_id` and `eta` over the call's own when given. Raises
    a ValidationError subclass saying what is wrong."""
    task = tasks.get(call.name)
    if task is None and call.queue is None:
        check_task_name(call.name)
        raise UnknownTask(
            f"task {call.name!r} is not registered in this app; pass queue=... to "
            "enqueue a task defined elsewhere"
        )
    if task is not None:
        # A workflow's step: the result it receives comes first.
        args = (None, *call.args) if call.receives else call.args
        task.arguments.check(call.name, args, call.kwargs)
        options = task.options
        template = task.template
        if call.queue is not None and call.queue != template.queue:
            template = envelope_template(
                call.name, call.queue, options.max_attempts, options.backoff, options.backoff_max
            )
            check_queue_allowed(template.queue, rules.allowed_queues)
        default_cost, default_priority = options.cost, options.priority
        limit = options.limit
        limit_key = (
            None
            if limit is None
            else limit.key(call.tenant, call.name, task.arguments.signature, args, call.kwargs)
        )
    else:
        template = envelope_template(
            call.name,
            call.queue or rules.queue,
            rules.max_attempts,
            rules.backoff,
            rules.backoff_max,
        )
        check_queue_allowed(template.queue, rules.allowed_queues)
        default_cost, default_priority = 1.0, 0
        limit_key = None
    if task_id is None and call.idempotency_key is not None:
        task_id = task_id_of(call)
    if eta is None and (call.countdown is not None or call.eta is not None):
        eta = resolve_eta(call.eta, call.countdown, now)
    # Its limit key (Limit.key) is checked already.
    return _run(
        template,
        call.tenant,
        call.args,
        call.kwargs,
        task_id,
        call.cost if call.cost is not None else default_cost,
        eta,
        rules.max_payload_bytes,
        call.priority if call.priority is not None else default_priority,
        limit_key,
    )
