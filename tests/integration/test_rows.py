"""Rows read by column name against the real schema: every read of the read
model and of the workers gets its rows with each field of its declared type,
and a task's stored story reads every column it selects."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from rota import core
from rota.core import db, read, stored
from rota.sql import query
from tests.helpers import claim, envelopes, load

Conn = psycopg.Connection[Any]
ME = "test:rows"


def check_types(value: Any, hint: Any, where: str) -> None:
    """`value` is of the type `hint` names (its outer type; and each item of a list)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        kinds = tuple(typing.get_origin(o) or o for o in options if o is not type(None))
        if value is None:
            assert type(None) in options, f"{where} is None"
            return
        assert isinstance(value, kinds), f"{where} = {value!r}, not {hint}"
        return
    assert isinstance(value, origin or hint), f"{where} = {value!r}, not {hint}"
    if origin is list:
        (item,) = typing.get_args(hint)
        for element in value:
            check_types(element, item, f"{where}[]")
    if _is_row(hint):
        check_typed(value)


def _is_row(kind: Any) -> bool:
    return dataclasses.is_dataclass(kind) or hasattr(kind, "_fields")


def check_typed(row: Any) -> None:
    for name, hint in typing.get_type_hints(type(row)).items():
        if hint is typing.Any or name.startswith("_"):
            continue
        check_types(getattr(row, name), hint, f"{type(row).__name__}.{name}")


def test_every_read_gets_rows_of_their_declared_types(conn: Conn) -> None:
    db.run(conn, core.configure_tenant("gold", concurrency_limit=5, capacity=50))
    db.run(conn, core.configure_tenant("silver", weight=2.0, rate_limit=2.0))
    later = datetime.now(UTC) + timedelta(hours=1)
    waiting = envelopes("gold", 3)
    (scheduled,) = envelopes("alice", 1, eta=later)
    (doomed,) = envelopes("bob", 1, max_attempts=1)
    load(conn, [doomed])
    (bobs,) = claim(conn, 1, worker="w1")
    db.transact(conn, core.fail([core.Failure(bobs.id, bobs.attempt, "boom")]))
    load(conn, [*waiting, scheduled])
    db.transact(conn, core.register_worker("w1", "host", 1, ["default"], 4))
    (running, done) = claim(conn, 2, worker="w1")
    for task in (running, done):
        check_typed(task)
    assert isinstance(running.payload, dict)
    db.transact(conn, core.complete([done.token]))
    db.transact(conn, core.record_loader_batch("checkpoint", 7))
    db.run(conn, core.cancel([waiting[2].id], ME))
    db.run(conn, core.count_service())
    db.run(conn, core.refresh_stats())

    ids = [doomed.id, running.id, done.id, scheduled.id, waiting[2].id]
    states = db.run(conn, core.task_states(ids))
    assert {s.status for s in states.values()} == {
        "dead",
        "running",
        "succeeded",
        "scheduled",
        "cancelled",
    }
    for task_id in ids:
        check_typed(states[task_id])
        story = db.run(conn, stored.stored_task(task_id))
        assert story is not None and story.id == task_id
        check_typed(story)
    everything: list[Any] = [
        *db.run(conn, read.queues()),
        *db.run(conn, read.tenants()).rows,
        *db.run(conn, read.top_tenants())[0],
        db.run(conn, read.tenant("gold")),
        db.run(conn, read.tenant("silver")),
        *db.run(conn, read.workers()),
        *db.run(conn, read.loader_batches()),
        *db.run(conn, read.audit()),
        *db.run(conn, core.live_workers()),
        *db.run(conn, core.worker_claims("w1")),
        *db.run(conn, core.fail([core.Failure(running.id, running.attempt, "again")])),
    ]
    for state in read.TASK_STATES:
        everything += db.run(conn, read.tasks(state))
    for row in everything:
        check_typed(row)
    kinds = {type(row).__name__ for row in everything}
    assert kinds >= {"QueueRow", "TenantRow", "TopTenant", "TenantDetail", "WorkerRow"}
    assert kinds >= {"LoaderBatch", "AuditRow", "WorkerInfo", "Held", "FailOutcome", "TaskRow"}
    gold = db.run(conn, read.tenant("gold"))
    assert gold is not None and gold.queues and gold.slot > 0
    counts = db.run(conn, read.queue_counts())["default"]
    assert all(type(n) is int for n in counts.values()) and counts["scheduled"] == 2


def test_a_stored_task_reads_every_column_of_its_story_by_name(conn: Conn) -> None:
    (task,) = envelopes("alice", 1)
    load(conn, [task])
    cur = conn.execute(query("task_story"), {"id": task.id})
    columns = [c.name for c in cur.description or ()]
    fields = {f.name for f in dataclasses.fields(stored.StoredTask)}
    # What the story selects is a field of the task's or where its row is
    # kept; the task's other fields are found afterwards.
    assert set(columns) - fields == {"seq", "queue_id", "tenant_id"}
    assert fields - set(columns) == {
        "ahead",
        "ahead_estimated",
        "queue_workers",
        "history",
        "ran_seconds",
        "urgent_before",
        "lower_ahead",
        "graph",
    }
    # A column taken straight from rota.tasks keeps its name there: the
    # task's fields are named as the table's columns.
    result = cur.pgresult
    assert result is not None
    tasks_oid = conn.execute("SELECT 'rota.tasks'::regclass::oid").fetchone()
    table_names = dict(
        conn.execute(
            "SELECT attnum, attname FROM pg_attribute WHERE attrelid = 'rota.tasks'::regclass"
        ).fetchall()
    )
    from_tasks = {
        name: table_names[result.ftablecol(i)]
        for i, name in enumerate(columns)
        if tasks_oid is not None and result.ftable(i) == tasks_oid[0]
    }
    assert from_tasks and all(name == column for name, column in from_tasks.items())
    story = db.run(conn, stored.stored_task(task.id))
    assert story is not None and isinstance(story.id, UUID) and story.status == "pending"
    assert story.ahead == 0 and story.payload.startswith("{")
