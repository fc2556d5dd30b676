"""Workflows in PostgreSQL: a graph's tasks loaded with its joins and
members in one transaction (rota.add_workflow refuses a bad graph, and
nothing of it stays), and a task's place in its graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from rota.core.db import Execute, Op, UUIDArray, first
from rota.core.load import columns_of, load
from rota.core.rows import Rows
from rota.model.envelope import TaskEnvelope
from rota.sql import query


@dataclass(frozen=True)
class Join:
    """A task that waits for its members: their results ('one' or a
    'list') go before its own arguments (its payload)."""

    id: UUID
    results: str
    payload: str


@dataclass(frozen=True)
class Member:
    id: UUID
    join: UUID
    position: int


def add_workflow(
    envelopes: Sequence[TaskEnvelope],
    joins: Sequence[Join],
    members: Sequence[Member],
    tenant: str,
    waiting_at: datetime,
) -> Op[int]:
    """Loads a workflow's new tasks (its joins scheduled at `waiting_at`)
    and stores its joins and members; returns the tasks stored. Run it in a
    transaction of its own (db.transact): a refused graph rolls back whole."""
    joined = columns_of(envelopes, {m.id: m.join for m in members})
    stored = yield from load(joined, last=False)
    yield Execute(
        query("add_workflow"),
        {
            "joins": UUIDArray(j.id for j in joins),
            "results": [j.results for j in joins],
            "payloads": [j.payload for j in joins],
            "members": UUIDArray(m.id for m in members),
            "member_joins": UUIDArray(m.join for m in members),
            "positions": [m.position for m in members],
            "tenant": tenant,
            "waiting_at": waiting_at,
        },
    )
    return stored


@dataclass(frozen=True)
class TaskGraph:
    """A task's place in a workflow (all None/empty when it has none)."""

    join_id: UUID | None  # the join it is a member of
    join_waiting: int | None  # that join's members yet to succeed
    join_members: int | None
    waiting: int | None  # as a join: its members yet to succeed
    members: int | None
    failed_member: UUID | None  # as a join: the member whose end made it dead
    member_ids: list[UUID]  # as a join: its members, in order


def task_graph(task_id: UUID) -> Op[TaskGraph]:
    found = yield from first(query("task_graph"), {"id": task_id}, Rows(TaskGraph))
    assert found is not None  # the query always returns its one row
    return found
