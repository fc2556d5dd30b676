"""The one columnar form a load takes (rota.core.load.TaskColumns): the
loaders read it off the buffer's batches exactly as `columns_of` makes it of
the same tasks' envelopes, and its parts, joins and envelopes keep every
field; the rows the benchmarks COPY are the load's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rota.buffer.entries import TaskBatch
from rota.core.copyrows import TASK_COPY_TYPES_LEAN, copy_rows, task_rows
from rota.core.db import Copy, Execute
from rota.core.load import TaskColumns, _Prepared, _prepared, columns_of
from rota.loader.store import batch_columns
from rota.model.envelope import TaskEnvelope, envelope_template, make_envelope
from rota.sql import query

NOW = datetime.now(UTC)


def _batches() -> list[TaskBatch]:
    parse = envelope_template("app.parse", "pdfs", max_attempts=5, backoff_base=2.0)
    mail = envelope_template("app.mail", "mail", backoff_max=60.0)
    one = TaskBatch(NOW)
    for i in range(5):
        one.add(parse, f"t{i % 2}", [i])
    mixed = TaskBatch(NOW + timedelta(seconds=1))
    for i in range(7):
        mixed.add(
            mail if i % 3 else parse,
            f"t{i % 3}",
            [i],
            cost=1.0 + i,
            eta=NOW + timedelta(hours=1) if i == 4 else None,
            priority=i % 2,
            limit_key="smtp" if i == 2 else None,
        )
    return [one, TaskBatch.empty(), mixed]


def test_a_loader_reads_the_columns_the_envelopes_give() -> None:
    batches = _batches()
    from_batches = batch_columns(batches)
    assert from_batches == columns_of([e for b in batches for e in b.envelopes()])
    assert len(from_batches) == 12
    assert batch_columns([]) == columns_of([])


def test_parts_joins_and_envelopes_keep_every_field() -> None:
    envelopes = [e for b in _batches() for e in b.envelopes()]
    tasks = columns_of(envelopes, {envelopes[3].id: envelopes[0].id})
    assert [tasks.envelope(i) for i in range(len(tasks))] == envelopes
    assert tasks.part(slice(0, len(tasks))) is tasks
    picked = tasks.part([1, 3, 8])
    assert [picked.envelope(i) for i in range(3)] == [envelopes[i] for i in (1, 3, 8)]
    assert picked.join_ids == [None, envelopes[0].id, None]
    assert type(picked.ids) is type(tasks.ids)
    parts = [tasks.part(slice(0, 4)), columns_of(envelopes[4:])]
    assert TaskColumns.joined(parts) == tasks


@pytest.mark.parametrize("options", [False, True])
def test_the_benchmarks_rows_are_the_loads(options: bool) -> None:
    envelopes = [e for b in _batches() for e in b.envelopes()]
    tasks = columns_of(envelopes)
    seqs = list(range(100, 100 + len(tasks)))
    queue_id, tenant_id = {"pdfs": 1, "mail": 2}, {"t0": 1, "t1": 2, "t2": 3}
    extra = (tasks.priorities, tasks.limit_keys) if options else ()
    loads = list(copy_rows(tasks, seqs, queue_id, tenant_id, NOW, *extra))
    numbered = zip(seqs, envelopes, strict=True)
    assert list(task_rows(numbered, queue_id, tenant_id, NOW, options)) == loads
    assert {row[10] for row in loads} == {"pending", "scheduled"}


def _copy_of(envelopes: list[TaskEnvelope]) -> Copy:
    """The COPY a load of these tasks sends (load_prepare answered here)."""
    tasks = columns_of(envelopes)
    op = _prepared(tasks)
    step = next(op)
    assert isinstance(step, Execute) and step.query == query("load_prepare")
    queues, tenants = sorted(set(tasks.queues)), sorted(set(tasks.tenants))
    answer = [
        _Prepared(
            list(range(1, len(queues) + 1)),
            list(range(1, len(tenants) + 1)),
            NOW,
            list(range(1, len(tasks) + 1)),
            [],
        )
    ]
    try:
        op.send(answer)
    except StopIteration as done:
        count, copy = done.value
        assert count == len(tasks)
        assert isinstance(copy, Copy)
        return copy
    raise AssertionError("the load asked for more than load_prepare")


def test_tasks_that_keep_the_defaults_leave_their_columns_out_of_the_copy() -> None:
    plain = [make_envelope(name="n", queue="q", tenant=f"t{i % 3}", args=[i]) for i in range(10)]
    lean = _copy_of(plain)
    assert lean.query == query("copy_tasks_lean")
    rows = list(lean.rows)
    assert len(rows[0]) == len(TASK_COPY_TYPES_LEAN) == len(lean.types)
    assert [row[0] for row in rows] == [t.id for t in plain]
    # One task off a default, or with an ETA: every column goes.
    for other in (
        make_envelope(name="n", queue="q", tenant="t0", args=[], cost=2.0),
        make_envelope(name="n", queue="q", tenant="t0", args=[], max_attempts=4),
        make_envelope(name="n", queue="q", tenant="t0", args=[], backoff_base=2.0),
        make_envelope(name="n", queue="q", tenant="t0", args=[], eta=NOW),
    ):
        assert _copy_of([*plain, other]).query == query("copy_tasks")


def test_the_benchmarks_lean_rows_are_the_loads() -> None:
    plain = [make_envelope(name="n", queue="q", tenant=f"t{i % 3}", args=[i]) for i in range(10)]
    copy = _copy_of(plain)
    numbered = zip(range(1, 11), plain, strict=True)
    tenants = {f"t{i}": i + 1 for i in range(3)}
    assert list(task_rows(numbered, {"q": 1}, tenants, NOW, lean=True)) == list(copy.rows)
