"""`rota worker --pool processes`: sync tasks run in child processes; a run
past its hard limit is killed with its process, the soft limit raises in the
task, a child killed by kill -9 fails its task and is replaced, and a worker
killed by kill -9 leaves no child behind."""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg

from rota import App, core
from rota.core import db
from tests.acceptance.test_workers import enqueue, logged, start_worker, stop
from tests.acceptance.workapp import (
    add,
    async_add,
    boom,
    flaky,
    hangs,
    logs_then_sleeps,
    pid,
    tidies_up,
)
from tests.helpers import wait_for


def _state(conn: psycopg.Connection[Any], task_id: Any) -> core.TaskState:
    return db.run(conn, core.task_states([task_id]))[task_id]


def _ended(conn: psycopg.Connection[Any], task_id: Any) -> core.TaskState:
    return wait_for(
        lambda: (s := _state(conn, task_id)).status in ("succeeded", "dead", "cancelled") and s,
        timeout=30,
        what=f"task {task_id} to end",
    )


def _children(worker_pid: int) -> set[int]:
    """The worker's descendants (the fork server and its children)."""
    found, frontier = set(), {worker_pid}
    while frontier:
        parent = frontier.pop()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == parent and int(entry) not in found:
                    found.add(int(entry))
                    frontier.add(int(entry))
    return found


def _alive(pid_: int) -> bool:
    try:
        with open(f"/proc/{pid_}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_tasks_run_in_children_with_results_retries_and_failures(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    worker = start_worker(env, "--pool", "processes", "--concurrency", "2")
    try:
        add_id, pid_id, async_id, boom_id, flaky_id = enqueue(
            conn,
            producer,
            [
                add.using(tenant="a").prepare(2, 3),
                pid.using(tenant="a").prepare(),
                async_add.using(tenant="b").prepare(1, 2),  # async: the worker's event loop
                boom.using(tenant="b").prepare(),
                flaky.using(tenant="c").prepare(1),  # rota.Retry crosses the pipe
            ],
        )
        assert producer.result(add_id).get(timeout=30) == {"sum": 5, "attempt": 1}
        child = producer.result(pid_id).get(timeout=30)
        assert child != worker.process.pid and child in _children(worker.process.pid)
        assert producer.result(async_id).get(timeout=30) == 3
        # The child's exception, its message and traceback, as a thread's would be.
        failed = wait_for(
            lambda: (s := _state(conn, boom_id)).last_error and s, what="boom's first failure"
        )
        assert failed.last_error == "ValueError: boom"
        trace = conn.execute(
            "SELECT traceback FROM rota.tasks WHERE id = %s", (boom_id,)
        ).fetchone()
        assert trace is not None and 'raise ValueError("boom")' in trace[0]
        assert _ended(conn, flaky_id).status == "succeeded"
        assert _state(conn, flaky_id).attempts == 2
    finally:
        stop(worker)
    assert worker.process.returncode == 0


def test_the_hard_limit_kills_the_run_and_the_soft_limit_raises_in_it(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    worker = start_worker(env, "--pool", "processes", "--concurrency", "1")
    try:
        before = producer.result(enqueue(conn, producer, [pid.using(tenant="a").prepare()])[0])
        first_child = before.get(timeout=30)
        hung, tidy, after = enqueue(
            conn,
            producer,
            [
                hangs.using(tenant="a").prepare(),  # sleeps 60 s in C: timeout=1 kills it
                tidies_up.using(tenant="a").prepare(),
                pid.using(tenant="a").prepare(),
            ],
        )
        state = _ended(conn, hung)
        assert state.status == "dead"
        assert state.last_error == (
            "rota.consumer.processes.HardTimeLimit: killed at its hard time limit (timeout) of 1 s"
        )
        # Killed with its run: the end is reported without waiting for the
        # kill to land (rota.consumer.processes), so the child may still be
        # going down for a moment.
        wait_for(lambda: not _alive(first_child), what="the hung run's child to die")
        # SoftTimeLimitExceeded at 0.5 s, caught by the task, which returns.
        assert producer.result(tidy).get(timeout=30) == "tidied up"
        # The worker serves on, in a new child.
        assert producer.result(after).get(timeout=30) not in (first_child, worker.process.pid)
    finally:
        stop(worker)


def test_a_child_killed_by_kill_9_fails_its_task_and_the_worker_carries_on(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    worker = start_worker(env, "--pool", "processes", "--concurrency", "1")
    try:
        (victim,) = enqueue(conn, producer, [logs_then_sleeps.using(tenant="a").prepare(60)])
        (row,) = wait_for(lambda: logged(conn), what="the task to start in its child")
        os.kill(row[3], signal.SIGKILL)
        state = _ended(conn, victim)
        assert state.status == "dead"  # max_attempts=1
        assert state.last_error == (
            "rota.consumer.processes.ChildDied: the task's process died: killed by SIGKILL"
        )
        (after,) = enqueue(conn, producer, [pid.using(tenant="a").prepare()])
        assert producer.result(after).get(timeout=30) != row[3]
        assert worker.poll() is None
    finally:
        stop(worker)


def test_a_worker_killed_by_kill_9_leaves_no_child_behind(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    worker = start_worker(env, "--pool", "processes", "--concurrency", "2")
    try:
        enqueue(conn, producer, [logs_then_sleeps.using(tenant="a").prepare(60)])
        wait_for(lambda: logged(conn), what="the task to start in its child")
        children = _children(worker.process.pid)
        assert len(children) >= 2  # the fork server and the task's child
        worker.process.kill()
        worker.process.wait(timeout=10)
        wait_for(
            lambda: not any(_alive(c) for c in children), timeout=10, what="the children to go"
        )
    finally:
        stop(worker, None)


def test_sigterm_to_the_process_group_lets_running_tasks_finish(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    """A service manager signals every process of the group: the children
    leave it to the worker, which lets their tasks finish within the grace."""
    worker = start_worker(
        {**env, "ROTA_SHUTDOWN_GRACE_SECONDS": "30"},
        "--pool",
        "processes",
        start_new_session=True,
    )
    try:
        (task,) = enqueue(conn, producer, [logs_then_sleeps.using(tenant="a").prepare(1)])
        wait_for(lambda: logged(conn), what="the task to start in its child")
        os.killpg(worker.process.pid, signal.SIGTERM)
        assert worker.process.wait(timeout=30) == 0
        assert _state(conn, task).status == "succeeded", worker.errors()
    finally:
        stop(worker, None)


def test_a_child_that_dies_while_idle_is_replaced_before_its_next_task(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    worker = start_worker(env, "--pool", "processes", "--concurrency", "1")
    try:
        (first,) = enqueue(conn, producer, [pid.using(tenant="a").prepare()])
        idle = producer.result(first).get(timeout=30)
        os.kill(idle, signal.SIGKILL)  # the OOM killer, between two tasks
        wait_for(lambda: not _alive(idle), what="the idle child to die")
        (second,) = enqueue(conn, producer, [pid.using(tenant="a").prepare()])
        assert producer.result(second).get(timeout=30) not in (idle, worker.process.pid)
        assert _state(conn, second).attempts == 1  # its one attempt, not a failed one first
    finally:
        stop(worker)
