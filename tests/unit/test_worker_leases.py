"""A worker cut off from the database for longer than a lease does not start
the tasks it had prefetched: their leases may have run out (counted from
when the claim or heartbeat that set them was sent)."""

from __future__ import annotations

import contextvars
import threading
import time
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from rota import App, Settings
from rota.consumer.running import TaskPool
from rota.consumer.worker import InFlight, StaleClaim, Worker
from rota.core import ClaimedTask


def _run(worker: Worker, task: Any, flight: InFlight) -> None:
    """As a pool thread runs a task: in a context of its own, so that the
    task's context variables stay out of the test's."""
    contextvars.copy_context().run(worker._run_sync, task, flight)


def _flight(leased_from: float) -> InFlight:
    now = datetime.now(UTC)
    task = ClaimedTask(uuid4(), "t", {"args": [], "kwargs": {}}, "q", "a", 1, 3, now, now)
    return InFlight(task, timeout=None, leased_from=leased_from)


def test_a_prefetched_task_is_not_started_once_its_lease_surely_ran_out() -> None:
    app = App(Settings(lease_seconds=60))
    ran: list[int] = []
    task = app.task(name="t")(lambda: ran.append(1))
    worker = Worker(app, queues=["q"])
    try:
        now = time.monotonic()
        # Its lease set (claimed, or renewed by a heartbeat) recently: runs.
        _run(worker, task, _flight(leased_from=now))
        assert ran == [1] and worker.outcomes.pop().error is None
        # Set over a lease ago and not renewed since: not started, and its
        # outcome hands it back.
        stale = _flight(leased_from=now - 61)
        _run(worker, task, stale)
        assert ran == [1] and stale.started_at is None
        assert isinstance(worker.outcomes.pop().error, StaleClaim)
        # Within the lease: still its own.
        _run(worker, task, _flight(leased_from=now - 59))
        assert ran == [1, 1] and worker.outcomes.pop().error is None
        assert not worker.outcomes
    finally:
        worker._pool.shutdown()


def test_a_task_handed_back_before_it_starts_never_starts() -> None:
    # Shutdown hands back unstarted tasks while the pool may be about to
    # start them: one of the two wins, never both.
    app = App(Settings())
    ran: list[int] = []
    task = app.task(name="t")(lambda: ran.append(1))
    worker = Worker(app, queues=["q"])
    try:
        flight = _flight(leased_from=time.monotonic())
        with worker._pool.starting:
            assert flight.hand_back()
        _run(worker, task, flight)
        assert ran == [] and flight.started_at is None and not worker.outcomes
    finally:
        worker._pool.shutdown()


def test_the_task_pool_runs_calls_on_its_threads_and_drops_unstarted_ones_at_shutdown() -> None:
    pool = TaskPool(2, "test-pool")
    release = threading.Event()
    ran: list[str] = []
    both_busy = threading.Barrier(3)

    def busy() -> None:
        ran.append(threading.current_thread().name)
        both_busy.wait(5)
        release.wait(5)

    pool.submit(busy)
    pool.submit(busy)
    both_busy.wait(5)  # both threads hold a call
    pool.submit(ran.append, "queued")
    pool.shutdown()
    release.set()
    for thread in pool._threads:
        thread.join(5)
        assert not thread.is_alive()
    assert sorted(ran) == ["test-pool_0", "test-pool_1"]  # the queued call never ran


def test_a_claims_lease_is_counted_from_before_the_claim_was_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The server starts the lease when the claim arrives: an answer that
    # comes back late (a slow link) must not lengthen it in the worker's eyes.
    app = App(Settings(lease_seconds=60))
    app.task(name="t")(lambda: None)
    worker = Worker(app, queues=["q"])
    sent: list[float] = []
    task = _flight(0.0).task

    def slow_claim(conn: Any, queues: list[str], wanted: int) -> list[ClaimedTask]:
        sent.append(time.monotonic())
        time.sleep(0.05)  # the answer on its way back
        return [task]

    monkeypatch.setattr(worker, "_claim", slow_claim)
    monkeypatch.setattr(worker, "_run_sync", lambda registered, flight: None)
    try:
        worker._step(None, ["q"])  # type: ignore[arg-type]
        assert worker.in_flight[task.id].leased_from <= sent[0]
    finally:
        worker._pool.shutdown()
