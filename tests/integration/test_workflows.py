"""Workflows in PostgreSQL, driven by claims and reports as a worker makes
them: a join waits (no place in line) until its members succeeded, then
runs once with their results; a member's death makes it dead, the member's
retry lets it wait again; a cancelled join stays cancelled; bad graphs are
refused with the reason and nothing stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest

import rota
from rota import App, Settings, core
from rota.core import db
from rota.core.results import KeptResult, complete_keeping
from rota.core.workflows import task_graph
from tests.helpers import claim

QUEUE = "flows"


@pytest.fixture
def flows(settings: Settings) -> Iterator[App]:
    app = App(settings)

    @app.task(queue=QUEUE, max_attempts=1)
    def step(n: int) -> int:
        return n

    @app.task(queue=QUEUE, max_attempts=1)
    def add(previous: int, n: int) -> int:
        return previous + n

    @app.task(queue=QUEUE, max_attempts=1)
    def gather(results: list[int], label: str) -> str:
        return label

    yield app
    app.close()


def _status(conn: psycopg.Connection[Any], task_id: UUID) -> str:
    return db.run(conn, core.task_states([task_id]))[task_id].status


def _succeed(conn: psycopg.Connection[Any], task: core.ClaimedTask, value: Any) -> None:
    kept = KeptResult(task.token, json.dumps(value), None, 3600.0)
    assert db.transact(conn, complete_keeping([kept])) == {task.id}


def _run_all(conn: psycopg.Connection[Any], value: Any = None) -> list[core.ClaimedTask]:
    """Claims what is in line and succeeds each, keeping `value` (else its first argument)."""
    claimed = claim(conn, queues=(QUEUE,))
    for task in claimed:
        _succeed(conn, task, task.args[0] if value is None else value)
    return claimed


def _promote(conn: psycopg.Connection[Any]) -> int:
    return int(db.transact(conn, core.promote_due(1000)))


def test_a_join_waits_out_of_line_then_runs_once_with_its_members_results(
    flows: App, conn: psycopg.Connection[Any]
) -> None:
    step, gather = flows.tasks["step"], flows.tasks["gather"]
    flow = rota.group(*(step.using(tenant="acme").prepare(n) for n in (3, 1, 2))).then(
        gather.using(tenant="acme").receiving("done")
    )
    stored = flows.enqueue_workflow(flow)
    members, join = stored.ids[:3], stored.last
    assert stored.ids[3] == join
    assert _status(conn, join) == "scheduled"
    assert _promote(conn) == 0  # waiting: not due
    graph = db.run(conn, task_graph(join))
    assert (graph.waiting, graph.members, graph.member_ids) == (3, 3, members)
    assert db.run(conn, task_graph(members[0])).join_id == join
    # Members in line, the join not: each member's claim asks it to keep its result.
    first = claim(conn, limit=2, queues=(QUEUE,))
    assert {t.id for t in first} <= set(members) and all("keep" in t.payload for t in first)
    for task in first:
        _succeed(conn, task, task.args[0] * 10)
    assert _promote(conn) == 0
    assert db.run(conn, task_graph(join)).waiting == 1
    (last,) = claim(conn, queues=(QUEUE,))
    _succeed(conn, last, last.args[0] * 10)
    assert _promote(conn) == 1  # due at once
    (joined,) = claim(conn, queues=(QUEUE,))
    assert joined.id == join
    assert joined.args == [[30, 10, 20], "done"]  # the members' results, in their order
    _succeed(conn, joined, "done")
    assert _promote(conn) == 0 and claim(conn, queues=(QUEUE,)) == []


def test_a_chain_passes_each_result_to_the_next_step(
    flows: App, conn: psycopg.Connection[Any]
) -> None:
    step = flows.tasks["step"]
    stored = flows.enqueue_workflow(
        rota.chain(
            step.using(tenant="acme").prepare(1),
            *(flows.tasks["add"].using(tenant="acme").receiving(n) for n in (2, 3)),
        )
    )
    seen = []
    for _ in range(3):
        (task,) = claim(conn, queues=(QUEUE,))
        seen.append(task.args)
        _succeed(conn, task, sum(task.args) * 2)
        _promote(conn)
    assert seen == [[1], [2, 2], [8, 3]]
    assert stored.last == stored.ids[2]
    assert claim(conn, queues=(QUEUE,)) == []


def test_a_dead_member_kills_its_join_and_its_retry_lets_the_join_wait_again(
    flows: App, conn: psycopg.Connection[Any]
) -> None:
    step, gather = flows.tasks["step"], flows.tasks["gather"]
    inner = rota.group(*(step.using(tenant="acme").prepare(n) for n in (1, 2))).then(
        gather.using(tenant="acme").receiving("inner")
    )
    outer = rota.chain(inner, gather.using(tenant="acme").receiving("outer"))
    stored = flows.enqueue_workflow(outer)
    _, b, inner_join, outer_join = stored.ids
    task_a, task_b = sorted(claim(conn, queues=(QUEUE,)), key=lambda t: t.args[0])
    failure = core.Failure(task_b.id, task_b.attempt, "ValueError: bad page")
    db.transact(conn, core.fail([failure]))
    assert _status(conn, b) == "dead"
    # Dead up the tree, each with the reason.
    states = db.run(conn, core.task_states([inner_join, outer_join]))
    assert states[inner_join].status == "dead"
    assert states[inner_join].last_error == f"member {b} died: ValueError: bad page"
    assert states[outer_join].status == "dead"
    assert states[outer_join].last_error.startswith(f"member {inner_join} died: member {b}")
    _succeed(conn, task_a, 1)
    assert db.run(conn, task_graph(inner_join)).failed_member == b
    # The member retried: the joins wait again; its success releases the first.
    assert db.run(conn, core.retry([b], "test")) == {b}
    assert _status(conn, inner_join) == _status(conn, outer_join) == "scheduled"
    assert _promote(conn) == 1
    assert [t.id for t in _run_all(conn)] == [b]  # again
    assert _promote(conn) == 1
    (joined,) = claim(conn, queues=(QUEUE,))
    assert (joined.id, joined.args) == (inner_join, [[1, 2], "inner"])
    _succeed(conn, joined, "inner result")
    _promote(conn)
    (last,) = claim(conn, queues=(QUEUE,))
    assert (last.id, last.args) == (outer_join, ["inner result", "outer"])


def test_each_members_row_names_its_join_however_it_was_stored(
    flows: App, conn: psycopg.Connection[Any], settings: Settings
) -> None:
    """The completion counts a join down from its member's row (tasks.join_id):
    loaded with it, by COPY (a large workflow, whose join is a chain's step
    and so a member itself) or by the one INSERT (a small one), with no row
    written twice; set by rota.add_workflow for a task stored before its join."""
    step, gather = flows.tasks["step"], flows.tasks["gather"]

    def updated_rows(flow: rota.workflow.Node) -> tuple[rota.Workflow, int]:
        """The workflow stored in a transaction of ours, and the task rows it updated."""
        with psycopg.connect(settings.database_url) as own:
            stored = flows.enqueue_workflow(flow, connection=own)
            (updated,) = own.execute(
                "SELECT pg_stat_get_xact_tuples_updated('rota.tasks'::regclass)"
            ).fetchone() or (None,)
        return stored, int(updated)

    big, updated = updated_rows(
        rota.chain(
            rota.group(*(step.using(tenant="acme").prepare(n) for n in range(100))).then(
                gather.using(tenant="acme").receiving("big")
            ),
            flows.tasks["add"].using(tenant="acme").receiving(1),
        )
    )
    assert updated == 0
    small, updated = updated_rows(  # up to 64 tasks: one INSERT
        rota.group(*(step.using(tenant="acme").prepare(n) for n in range(3))).then(
            gather.using(tenant="acme").receiving("small")
        )
    )
    assert updated == 0
    (before,) = flows.enqueue_workflow(step.using(tenant="acme").prepare(7)).ids
    late, updated = updated_rows(
        rota.after(before).then(gather.using(tenant="acme").receiving("late"))
    )
    assert updated == 1
    rows = conn.execute(
        "SELECT m.task_id, m.join_id, t.join_id FROM rota.members m "
        "JOIN rota.tasks t ON t.id = m.task_id"
    ).fetchall()
    # The big group's, its join (a chain's step), the small group's, `before`.
    assert len(rows) == 100 + 1 + 3 + 1
    assert all(member_join == row_join for _, member_join, row_join in rows)
    assert {task: join for task, join, _ in rows}[before] == late.last
    # Everything in line runs; each join runs once its members have.
    ran: list[UUID] = []
    for _ in range(6):
        ran += [t.id for t in _run_all(conn, value=1)]
        _promote(conn)
    assert set(ran) == {*big.ids, *small.ids, before, late.last} and len(ran) == len(set(ran))


def test_a_workflow_stored_as_before_0046_still_counts_its_join_down(
    flows: App, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application of the version before 0046 loads a workflow's tasks
    without their joins: rota.add_workflow names them on the members' rows."""
    from rota.core import workflows

    loaded_as_before = workflows.load

    def load_without_joins(envelopes: Any, last: bool = True, joins: Any = None) -> Any:
        return loaded_as_before(envelopes, last)

    monkeypatch.setattr(workflows, "load", load_without_joins)
    step, gather = flows.tasks["step"], flows.tasks["gather"]
    stored = flows.enqueue_workflow(
        rota.group(*(step.using(tenant="acme").prepare(n) for n in range(70))).then(
            gather.using(tenant="acme").receiving("old")
        )
    )
    members = stored.ids[:70]
    assert conn.execute(
        "SELECT count(*) FROM rota.tasks WHERE id = ANY(%s) AND join_id = %s",
        (members, stored.last),
    ).fetchone() == (70,)
    ran = [t.id for t in _run_all(conn, value=1)]
    assert _promote(conn) == 1
    ran += [t.id for t in _run_all(conn, value=1)]
    assert sorted(ran) == sorted(stored.ids)


def test_a_cancelled_join_stays_cancelled_and_a_join_on_done_tasks_is_due_at_once(
    flows: App, conn: psycopg.Connection[Any]
) -> None:
    step, gather = flows.tasks["step"], flows.tasks["gather"]
    stored = flows.enqueue_workflow(
        rota.group(step.using(tenant="acme").prepare(1)).then(
            gather.using(tenant="acme").receiving("never")
        )
    )
    _, join = stored.ids
    assert db.run(conn, core.cancel([join], "test")) == {join: "cancelled"}
    _run_all(conn)
    assert _promote(conn) == 0
    assert _status(conn, join) == "cancelled"
    # Joining tasks that already succeeded: due now, with their results.
    (done,) = flows.enqueue_workflow(step.using(tenant="acme").prepare(5)).ids
    _run_all(conn)
    late = flows.enqueue_workflow(
        rota.after(done).then(gather.using(tenant="acme").receiving("late"))
    )
    assert _promote(conn) == 1
    (joined,) = claim(conn, queues=(QUEUE,))
    assert (joined.id, joined.args) == (late.last, [[5], "late"])


def test_bad_graphs_are_refused_with_the_reason_and_nothing_is_stored(
    flows: App, conn: psycopg.Connection[Any]
) -> None:
    step, gather = flows.tasks["step"], flows.tasks["gather"]
    (other,) = flows.enqueue_workflow(step.using(tenant="other").prepare(1)).ids
    (mine,) = flows.enqueue_workflow(step.using(tenant="acme").prepare(1)).ids
    flows.enqueue_workflow(rota.after(mine).then(gather.using(tenant="acme").receiving("x")))
    before = conn.execute("SELECT count(*) FROM rota.tasks").fetchone()
    unknown = UUID(int=7)
    cases = {
        "a join on an unknown task": rota.after(unknown).then(
            gather.using(tenant="acme").receiving("x")
        ),
        "is tenant other's": rota.after(other).then(gather.using(tenant="acme").receiving("x")),
        "already a member of join": rota.after(mine).then(
            gather.using(tenant="acme").receiving("y")
        ),
        "all one tenant's": rota.group(
            step.using(tenant="acme").prepare(1), step.using(tenant="other").prepare(2)
        ),
        "appears twice": rota.group(
            step.using(tenant="acme", idempotency_key="k").prepare(1),
            step.using(tenant="acme", idempotency_key="k").prepare(1),
        ),
    }
    for reason, flow in cases.items():
        with pytest.raises(rota.ValidationError, match=reason):
            flows.enqueue_workflow(flow)
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == before
    assert conn.execute("SELECT count(*) FROM rota.joins").fetchone() == (1,)


def test_a_huge_group_takes_only_its_tenants_turns(
    flows: App, conn: psycopg.Connection[Any]
) -> None:
    step, gather = flows.tasks["step"], flows.tasks["gather"]
    flows.enqueue_workflow(
        rota.group(*(step.using(tenant="big").prepare(n) for n in range(10_000))).then(
            gather.using(tenant="big").receiving("all")
        )
    )
    (single,) = flows.enqueue_workflow(step.using(tenant="small").prepare(1)).ids
    # Fair order: the small tenant's one task comes at its first turn, not
    # after the 10,000 members enqueued before it.
    first = claim(conn, limit=2, queues=(QUEUE,))
    assert single in {t.id for t in first}


def test_a_workflow_enqueued_from_asyncio_and_in_a_callers_transaction(
    flows: App, conn: psycopg.Connection[Any], settings: Settings
) -> None:
    import asyncio

    step, gather = flows.tasks["step"], flows.tasks["gather"]
    flow = rota.group(step.using(tenant="acme").prepare(1)).then(
        gather.using(tenant="acme").receiving("async")
    )

    async def enqueue() -> rota.Workflow:
        async with await psycopg.AsyncConnection.connect(settings.database_url) as aconn:
            stored = await flows.aenqueue_workflow(flow, connection=aconn)
            await aconn.rollback()  # the caller's transaction: nothing of it stays
        assert stored.last not in db.run(conn, core.task_states([stored.last]))
        return await flows.aenqueue_workflow(flow)

    stored = asyncio.run(enqueue())
    assert _status(conn, stored.last) == "scheduled"
    assert conn.execute("SELECT count(*) FROM rota.joins").fetchone() == (1,)
    # In a caller's transaction, rolled back: nothing stays.
    with psycopg.connect(settings.database_url) as other:
        flows.enqueue_workflow(flow, connection=other)
        other.rollback()
    assert conn.execute("SELECT count(*) FROM rota.joins").fetchone() == (1,)
