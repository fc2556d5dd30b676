"""A running task's progress without servers: the rules of a report, the
slot a task's reports go to, the worker's flush (what it sends, how often,
and that a failing one harms nothing), and a process-pool child's sending of
its progress over its pipe."""

from __future__ import annotations

import contextvars
import math
import multiprocessing
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

import rota
from rota.consumer import processes
from rota.consumer import progress as flushing
from rota.consumer.progress import ProgressFlush
from rota.errors import OutsideTask, ValidationError
from rota.model.progress import MESSAGE_MAX, Progress, check_progress
from rota.runtime.current import CancelFlag
from rota.runtime.progress import ProgressSlot
from rota.settings import Settings
from rota.testing import InMemory


@pytest.mark.parametrize(
    ("done", "total", "message", "expected"),
    [
        (0, None, None, (0.0, None, None)),
        (3, 10, "three", (3.0, 10.0, "three")),
        (2.5, 2.5, None, (2.5, 2.5, None)),
        (0, 0, "", (0.0, 0.0, "")),
        (10**15, None, None, (1e15, None, None)),
    ],
)
def test_good_reports_are_stored_as_floats(
    done: Any, total: Any, message: Any, expected: tuple[Any, ...]
) -> None:
    assert check_progress(done, total, message) == expected


@pytest.mark.parametrize(
    ("done", "total", "message", "said"),
    [
        (-1, None, None, "done is a finite number of at least 0"),
        (-0.5, 3, None, "done is a finite number of at least 0"),
        (math.nan, None, None, "done is a finite number of at least 0"),
        (math.inf, None, None, "done is a finite number of at least 0"),
        (1, math.inf, None, "total is a finite number of at least 0"),
        (1, -2, None, "total is a finite number of at least 0"),
        (5, 4, None, "done (5) is more than total (4)"),
        ("1", None, None, "done is a number (int or float), not str"),
        (None, None, None, "done is a number (int or float), not NoneType"),
        (True, None, None, "done is a number (int or float), not bool"),
        (1, "10", None, "total is a number (int or float), not str"),
        (10**400, None, None, "is not a finite number"),
        (1, 2, 3, "message is a str, not int"),
        (1, 2, b"bytes", "message is a str, not bytes"),
    ],
)
def test_bad_reports_are_refused(done: Any, total: Any, message: Any, said: str) -> None:
    with pytest.raises(ValidationError, match=r"^progress: ") as refused:
        check_progress(done, total, message)
    assert said in str(refused.value)


def test_a_long_message_is_cut_with_an_ellipsis() -> None:
    _, _, kept = check_progress(1, 2, "é" * (MESSAGE_MAX + 1))
    assert kept == "é" * (MESSAGE_MAX - 1) + "…" and len(kept) == MESSAGE_MAX
    assert check_progress(1, 2, "a" * MESSAGE_MAX)[2] == "a" * MESSAGE_MAX


def test_the_fraction_is_done_over_total() -> None:
    at = datetime.now(UTC)
    assert Progress(1, 4, None, at, 1).fraction == 0.25
    assert Progress(0, 0, None, at, 1).fraction == 1.0
    assert Progress(7, None, "seven", at, 2).fraction is None


def test_outside_a_task_there_is_no_context_to_report_to() -> None:
    with pytest.raises(OutsideTask):
        rota.context().progress(1)


def test_under_rota_testing_reports_are_checked() -> None:
    app = rota.App(
        Settings(database_url="postgresql://u:pw@db.invalid/app", redis_url="redis://r.invalid")
    )
    refused: list[str] = []

    @app.task(queue="imports")
    def import_rows(rows: int) -> int:
        ctx = rota.context()
        for done in range(1, rows + 1):
            ctx.progress(done, rows, f"row {done}")
        try:
            ctx.progress(rows + 1, rows)
        except ValidationError as exc:
            refused.append(str(exc))
        return rows

    with InMemory(app) as queue:
        import_rows.using(tenant="acme").enqueue(3)
        assert queue.run_all().succeeded == 1
    assert refused == ["progress: done (4) is more than total (3)"]


def _flight(task_id: uuid.UUID, attempt: int = 1) -> Any:
    return SimpleNamespace(task=SimpleNamespace(id=task_id, attempt=attempt))


def test_a_flush_sends_each_tasks_latest_values_once() -> None:
    in_flight: dict[uuid.UUID, Any] = {}
    flush = ProgressFlush(None, in_flight)
    a, b = uuid.uuid4(), uuid.uuid4()
    in_flight[a], in_flight[b] = _flight(a), _flight(b)
    slot_a, slot_b = flush.slot((a, 1)), flush.slot((b, 1))
    for i in range(100_000):
        slot_a.report(check_progress(i, 100_000))
    slot_b.report((1.0, None, "b"))
    changed = flush.changes()
    assert [(s.token, v) for s, v in changed] == [
        ((a, 1), (99_999.0, 100_000.0, None)),
        ((b, 1), (1.0, None, "b")),
    ]
    for slot, values in changed:
        slot.stored = values
    assert flush.changes() == []  # nothing new: nothing sent
    slot_a.report((100_000.0, 100_000.0, "done"))
    del in_flight[a]  # it ended: its last values are still sent
    assert [v for _, v in flush.changes()] == [(100_000.0, 100_000.0, "done")]
    slot_a.stored = slot_a.latest
    del in_flight[b]
    assert flush.changes() == [] and flush._watched == {}  # both forgotten


def test_a_slot_of_a_task_that_never_reports_costs_the_flush_nothing() -> None:
    in_flight: dict[uuid.UUID, Any] = {}
    flush = ProgressFlush(None, in_flight)
    for _ in range(1000):
        task_id = uuid.uuid4()
        in_flight[task_id] = _flight(task_id)
        flush.slot((task_id, 1))
    assert flush.changes() == [] and flush._watched == {}


def test_flushes_are_a_second_apart_and_a_failing_one_keeps_its_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[list[Any]] = []
    failing = [True]

    def run(_conn: Any, op: Any) -> Any:
        if failing[0]:
            raise RuntimeError("relation rota.progress does not exist")
        sent.append(op)
        return set()

    monkeypatch.setattr(flushing.db, "run", run)
    clock = [1000.0]
    monkeypatch.setattr(flushing.time, "monotonic", lambda: clock[0])
    task_id = uuid.uuid4()
    flush = ProgressFlush(None, {task_id: _flight(task_id)})
    slot = flush.slot((task_id, 1))
    slot.report((1.0, 2.0, None))
    flush.flush(object())  # fails: logged, not raised
    assert slot.stored is None
    failing[0] = False
    clock[0] += flushing.FLUSH_SECONDS / 2
    flush.flush(object())  # too soon
    assert sent == []
    clock[0] += flushing.FLUSH_SECONDS / 2
    flush.flush(object())
    assert len(sent) == 1 and slot.stored == (1.0, 2.0, None)
    slot.report((2.0, 2.0, None))
    flush.flush(object(), now=True)  # the shutdown's: at once
    assert len(sent) == 2 and slot.stored == (2.0, 2.0, None)


def test_a_child_sends_its_latest_progress_coalesced_and_the_last_before_its_answer() -> None:
    ours, theirs = multiprocessing.Pipe()
    sender = processes._Sender(theirs)
    task_id = uuid.uuid4()
    slot = processes._PipeProgress((task_id, 1), sender)
    for i in range(200_000):
        slot.report((float(i), 200_000.0, None))
    sender.answer(slot, ("ok", 42))
    slot.report((5.0, 6.0, "after its answer"))  # never sent
    messages = []
    while True:
        message = ours.recv()
        messages.append(message)
        if message[0] != "progress":
            break
    assert messages[-1] == ("ok", 42)
    progress = messages[:-1]
    assert 1 <= len(progress) <= 20, len(progress)  # not one per report
    assert all(m[1] == task_id for m in progress)
    assert progress[-1][2] == (199_999.0, 200_000.0, None)
    sender.send_progress(slot)
    assert not ours.poll(processes.PROGRESS_SEND_SECONDS * 2)


def test_a_flush_with_the_server_gone_raises_to_the_heartbeat_and_sends_again_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = [True]
    sent: list[Any] = []

    def run(_conn: Any, op: Any) -> Any:
        if down[0]:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        sent.append(op)
        return set()

    monkeypatch.setattr(flushing.db, "run", run)
    task_id = uuid.uuid4()
    flush = ProgressFlush(None, {task_id: _flight(task_id)})
    slot = flush.slot((task_id, 1))
    slot.report((1.0, None, None))
    with pytest.raises(psycopg.OperationalError):  # the heartbeat thread reconnects
        flush.flush(object())
    slot.report((2.0, None, None))
    down[0] = False
    flush.flush(object(), now=True)
    assert len(sent) == 1 and slot.stored == (2.0, None, None)


def test_the_context_is_made_once_per_run() -> None:
    from rota.core import ClaimedTask
    from rota.runtime.current import current_cancel, current_task
    from rota.runtime.progress import current_progress

    def run(name: str) -> tuple[rota.TaskContext, rota.TaskContext, ProgressSlot]:
        now = datetime.now(UTC)
        task = ClaimedTask(uuid.uuid4(), name, {}, "q", "acme", 1, 3, now, now)
        slot = ProgressSlot(task.token, None)
        current_task.set(task)
        current_cancel.set(CancelFlag())
        current_progress.set(slot)
        return rota.context(), rota.context(), slot

    def runs() -> None:
        first, again, slot = run("one")
        assert first is again and first.name == "one"
        first.progress(1, 2)
        assert slot.latest == (1.0, 2.0, None)
        second, _, other = run("two")  # the next run in this thread: its own context
        assert second is not first and second.name == "two"
        second.progress(2)
        assert (slot.latest, other.latest) == ((1.0, 2.0, None), (2.0, None, None))

    contextvars.Context().run(runs)  # this test's runs leave the others' context alone
