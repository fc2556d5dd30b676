"""Workflows: chains, groups and joins of tasks, kept fair.

    flow = rota.chain(
        parse.using(tenant="acme").prepare("a.pdf"),           # its result ...
        rota.group(*(index.using(tenant="acme").prepare(p) for p in pages))
            .then(notify.using(tenant="acme").prepare()),      # ... see below
    )

A chain runs its steps in turn, each step getting the previous one's
result as its first argument; a group runs its members in parallel; a
group's `then` (a join) runs once every member has succeeded, with the list
of their results as its first argument. A graph is a tree: a task belongs to
one join at most. Every task of a graph is one tenant's and takes that
tenant's turns; a waiting join holds no place in line, slot or concurrency
count. A graph goes straight to PostgreSQL, in one transaction, with the
dependencies (rota.add_workflow), so that a join runs exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias
from uuid import UUID

import orjson

from rota.buffer.entries import TaskBatch
from rota.core.workflows import Join, Member
from rota.errors import ValidationError
from rota.model.calls import CallRules, check_call, task_id_of
from rota.model.envelope import TaskEnvelope, new_task_id
from rota.model.rules import LATEST
from rota.runtime import tracing
from rota.task import TaskCall

if TYPE_CHECKING:
    from rota.core.db import Op
    from rota.settings import Settings
    from rota.task import AsyncConnection, SyncConnection, Task


class Enqueuing(Protocol):
    """What a workflow's enqueue uses of its app (rota.App)."""

    settings: Settings
    tasks: dict[str, Task[Any, Any]]

    @property
    def producer(self) -> Any: ...

    @property
    def aproducer(self) -> Any: ...


# A waiting join is loaded scheduled at this time (and taken off the
# schedule in the same transaction): no task is ever due then.
WAITING_AT = LATEST - timedelta(days=1)
# Seconds a member's result is kept for its join (longer if its task keeps
# its results longer).
MEMBER_RESULT_TTL = 7 * 86_400.0


@dataclass(frozen=True)
class After:
    """Tasks enqueued before, as members of a join (`rota.after(ids).then(...)`)."""

    ids: tuple[UUID, ...]

    def then(self, join: TaskCall) -> Group:
        return Group((self,), join)


@dataclass(frozen=True)
class Group:
    """Members run in parallel; `then(call)` adds a join, run once all succeeded."""

    members: tuple[Node, ...]
    join: TaskCall | None = None

    def then(self, join: TaskCall) -> Group:
        if self.join is not None:
            raise ValidationError("this group has a join already: chain another step instead")
        return Group(self.members, join)


@dataclass(frozen=True)
class Chain:
    """Steps run in turn; each gets the previous step's result (a list, after
    a group) as its first argument."""

    steps: tuple[Node, ...]


Node: TypeAlias = TaskCall | Group | Chain | After
# The id an enqueue gives a call (an idempotency key's), or None for a new one.
NewId: TypeAlias = Callable[[TaskCall], UUID | None]


def chain(*steps: Node) -> Chain:
    if not steps:
        raise ValidationError("a chain needs at least one step")
    return Chain(tuple(steps))


def group(*members: Node) -> Group:
    if not members:
        raise ValidationError("a group needs at least one member")
    return Group(tuple(members))


def after(*task_ids: UUID) -> After:
    """Tasks already enqueued, to join (`rota.after(a, b).then(report)`)."""
    if not task_ids:
        raise ValidationError("after() needs at least one task id")
    return After(tuple(UUID(str(t)) for t in task_ids))


@dataclass(frozen=True)
class Workflow:
    """What `app.enqueue_workflow` stored: every new task's id, in the order
    the graph names them, and `last`, the task whose end is the graph's."""

    ids: list[UUID]
    last: UUID


@dataclass
class Plan:
    """A graph flattened into tasks, joins and members."""

    calls: list[tuple[UUID, TaskCall]] = field(default_factory=list)
    joins: dict[UUID, str] = field(default_factory=dict)  # join id -> 'one' or 'list'
    members: list[Member] = field(default_factory=list)
    seen: set[UUID] = field(default_factory=set)

    def task(self, call: TaskCall, new_id: NewId) -> UUID:
        task_id = new_id(call) or new_task_id()
        if task_id in self.seen:
            raise ValidationError(
                f"task {task_id} appears twice in the workflow (the same idempotency key?): "
                "a graph is a tree, each task in one place"
            )
        self.seen.add(task_id)
        self.calls.append((task_id, call))
        return task_id

    def add(self, node: Node, new_id: NewId) -> list[UUID]:
        """Adds `node`; returns the tasks whose ends are its end."""
        if isinstance(node, TaskCall):
            if node.receives:
                raise ValidationError(
                    f"{node.name} receives a result, but nothing comes before it in the workflow"
                )
            return [self.task(node, new_id)]
        if isinstance(node, After):
            return list(node.ids)
        if isinstance(node, Group):
            ends = [end for member in node.members for end in self.add(member, new_id)]
            return ends if node.join is None else [self.join(node.join, ends, "list", new_id)]
        ends = self.add(node.steps[0], new_id)
        for step in node.steps[1:]:
            if not isinstance(step, TaskCall):
                raise ValidationError(
                    "a chain's step after the first is a task (a group's members cannot all "
                    "follow one step: a task has one join at most); put the group first, "
                    "or enqueue it from the step"
                )
            ends = [self.join(step, ends, "one" if len(ends) == 1 else "list", new_id)]
        return ends

    def join(self, call: TaskCall, members: list[UUID], results: str, new_id: NewId) -> UUID:
        if not call.receives:
            raise ValidationError(
                f"{call.name}, a join or a chain's later step, receives a result first: "
                "prepare it with .using(...).receiving(...)"
            )
        join_id = self.task(call, new_id)
        self.joins[join_id] = results
        self.members.extend(Member(m, join_id, n) for n, m in enumerate(members))
        return join_id


def plan(flow: Node, new_id: NewId) -> tuple[Plan, str]:
    """The graph's plan and its tenant; refuses a graph that spans tenants."""
    made = Plan()
    made.add(flow, new_id)
    if not made.calls:
        raise ValidationError("a workflow needs at least one new task")
    tenants = sorted({call.tenant for _, call in made.calls})
    if len(tenants) > 1:
        raise ValidationError(
            f"a workflow's tasks are all one tenant's, not {', '.join(map(repr, tenants))}"
        )
    members = [m.id for m in made.members]
    if len(set(members)) != len(members):
        raise ValidationError("a task is a member of two joins: a task has one join at most")
    return made, tenants[0]


def joins_of(made: Plan, envelopes: Sequence[TaskEnvelope]) -> list[Join]:
    """The joins, each with its own payload (its members' results go before it)."""
    payloads = {e.id: e.payload for e in envelopes}
    return [Join(j, results, payloads[j]) for j, results in made.joins.items()]


def keep_for_join(payload: str, ttl: float | None) -> str:
    """A member's payload, asking its worker to keep its result for its join."""
    keep = max(ttl or 0.0, MEMBER_RESULT_TTL)
    return payload[:-1] + f',"keep":{orjson.dumps(keep).decode()}}}'


def members_of(made: Plan) -> set[UUID]:
    return {m.id for m in made.members}


def enqueue(app: Enqueuing, flow: Node, connection: SyncConnection | None = None) -> Workflow:
    """`App.enqueue_workflow`: checks the graph, then loads its tasks and
    stores its joins and members in one transaction."""
    import psycopg

    op, stored, batch = _prepared(app, flow)
    with tracing.enqueue(batch, app.settings.max_payload_bytes):
        try:
            app.producer.transact(op(), connection)
        except psycopg.errors.RaiseException as exc:
            raise ValidationError(exc.diag.message_primary or str(exc)) from None
    return stored


async def aenqueue(
    app: Enqueuing, flow: Node, connection: AsyncConnection | None = None
) -> Workflow:
    """`enqueue`, awaited (`App.aenqueue_workflow`)."""
    import psycopg

    op, stored, batch = _prepared(app, flow)
    with tracing.enqueue(batch, app.settings.max_payload_bytes):
        try:
            await app.aproducer.transact(op(), connection)
        except psycopg.errors.RaiseException as exc:
            raise ValidationError(exc.diag.message_primary or str(exc)) from None
    return stored


def _prepared(app: Enqueuing, flow: Node) -> tuple[Callable[[], Op[int]], Workflow, TaskBatch]:
    """The graph checked and made into tasks: the operation that stores it
    (made once tracing had its say in the payloads), what it stores, and
    its tasks' batch."""
    from rota.core.workflows import add_workflow

    made, tenant = plan(flow, task_id_of)
    batch = TaskBatch.empty()
    rules, now = CallRules.of(app.settings), batch.enqueued_at
    for task_id, call in made.calls:
        eta = WAITING_AT if task_id in made.joins else None
        batch.append(check_call(call, app.tasks, rules, now, task_id, eta))
    members = members_of(made)
    for i, task_id in enumerate(batch.ids):
        if task_id in members:
            registered = app.tasks.get(batch.templates[batch.template[i]].name)
            ttl = registered.options.result_ttl if registered is not None else None
            batch.payloads[i] = keep_for_join(batch.payloads[i], ttl)

    def op() -> Op[int]:
        envelopes = batch.envelopes()
        joins = joins_of(made, envelopes)
        return add_workflow(envelopes, joins, made.members, tenant, WAITING_AT)

    return op, Workflow(list(batch.ids), _last(made)), batch


def _last(made: Plan) -> UUID:
    """The join no other join waits for (the graph's end), or the last task."""
    members = members_of(made)
    ends = [j for j in made.joins if j not in members]
    return ends[-1] if ends else made.calls[-1][0]
