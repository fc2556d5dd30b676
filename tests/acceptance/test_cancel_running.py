"""Cancelling a running task reaches the worker that holds it: an async task
is cancelled at its await, a sync one sees the flag and stops, one in the
process pool is killed with its process; the task ends
cancelled, once, and the tenant's freed slot is taken by its next task."""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg
import pytest

from rota import App, Settings, core
from rota.core import db
from tests.acceptance.test_workers import enqueue, logged, start_worker, stop
from tests.acceptance.workapp import async_sleep, patient, patient_logged, sleep
from tests.helpers import wait_for


def _status(conn: psycopg.Connection[Any], task_id: Any) -> str:
    return db.run(conn, core.task_states([task_id]))[task_id].status


def _running(conn: psycopg.Connection[Any], task_id: Any) -> bool:
    row = conn.execute("SELECT 1 FROM rota.running WHERE task_id = %s", (task_id,)).fetchone()
    return row is not None


@pytest.mark.parametrize("kind", ["sync, cooperative", "async", "process pool, killed"])
def test_a_running_task_is_cancelled_and_its_slot_freed(
    kind: str, env: dict[str, str], settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    db.transact(conn, core.configure_tenant("held", concurrency_limit=1))
    # The process pool's task never looks at the flag: its process is killed.
    long = {"sync": patient, "async": async_sleep, "process": sleep}[kind.split()[0].strip(",")]
    pool = ["--pool", "processes"] if kind.startswith("process") else []
    with App(settings) as producer:
        first, after = enqueue(
            conn,
            producer,
            [long.using(tenant="held").prepare(60), sleep.using(tenant="held").prepare(0)],
        )
    worker = start_worker(env, "--concurrency", "4", *pool)
    try:
        wait_for(lambda: _running(conn, first), timeout=30, what="the long task to run")
        time.sleep(0.3)  # well started
        assert not any(row[0] == after for row in logged(conn))  # held back by the limit
        asked = time.monotonic()
        assert db.run(conn, core.cancel([first], "test")) == {first: "cancelling"}
        wait_for(lambda: _status(conn, first) == "cancelled", timeout=10, what="the cancel")
        ended = time.monotonic() - asked
        # The tenant's one slot is free: its next task runs.
        wait_for(lambda: any(row[0] == after for row in logged(conn)), timeout=10, what="next")
        took_slot = time.monotonic() - asked
        print(f"{kind}: cancelled in {ended * 1000:.0f} ms, next task ran after {took_slot:.2f} s")
        assert ended < 2.0 and took_slot < 3.0
        # Ended once: no retry, no log of a run, the running row gone.
        assert not _running(conn, first)
        assert not any(row[0] == first for row in logged(conn))
        wait_for(lambda: not _running(conn, after), timeout=10, what="the next task's end")
        counted = conn.execute("SELECT running FROM rota.tenants WHERE name = 'held'").fetchone()
        assert counted == (0,)  # the limit's count released once each
    finally:
        stop(worker)


def test_a_cancel_reaches_a_worker_that_is_shutting_down(
    env: dict[str, str], settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    """SIGTERM: the worker waits for its running task within the grace; a
    cancel sent meanwhile still stops it, and the worker exits at once."""
    with App(settings) as producer:
        (task,) = enqueue(conn, producer, [patient_logged.using(tenant="t").prepare(60)])
    worker = start_worker({**env, "ROTA_SHUTDOWN_GRACE_SECONDS": "60"})
    try:
        # Started, not only claimed: a claimed task not yet started is handed
        # back at a SIGTERM, and the worker then exits at once.
        wait_for(lambda: any(row[0] == task for row in logged(conn)), timeout=30, what="the start")
        worker.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # shutting down, waiting for its running task
        assert worker.poll() is None
        asked = time.monotonic()
        db.run(conn, core.cancel([task], "test"))
        wait_for(lambda: _status(conn, task) == "cancelled", timeout=10, what="the cancel")
        assert worker.wait(timeout=10) == 0
        print(
            f"cancelled during shutdown; the worker exited {time.monotonic() - asked:.2f} s later"
        )
    finally:
        stop(worker, None)
