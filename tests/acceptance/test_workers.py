"""Worker processes with real signals: kill -9, SIGTERM, limits, cron."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota import App, Settings, TaskCall, core
from rota.core import db
from rota_tools.devservers import Server
from tests.helpers import LoggedProcess, start_logged, wait_for

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def start_worker(env: dict[str, str], *extra: str, **popen: Any) -> LoggedProcess:
    return start_logged(
        [
            sys.executable,
            "-m",
            "rota",
            "worker",
            "--app",
            "tests.acceptance.workapp:app",
            "--queues",
            "work",
            *extra,
        ],
        env=env,
        cwd=ROOT,
        **popen,
    )


def enqueue(conn: psycopg.Connection[Any], producer: App, calls: list[Any]) -> list[Any]:
    return producer.enqueue_many(calls, connection=conn)


def logged(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT task_id, tenant, attempt, pid, started, ended FROM test_log ORDER BY started"
    ).fetchall()


def stop(process: LoggedProcess, signum: int = signal.SIGTERM) -> None:
    process.stop(signum, timeout=30)  # also killed if it has not stopped by then


def test_a_worker_killed_mid_task_loses_nothing(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    sleep = producer.tasks["sleep"]
    ids = enqueue(conn, producer, [sleep.using(tenant="a").prepare(1.5)])
    doomed = start_worker(env, "--concurrency", "1")
    wait_for(lambda: db.run(conn, core.task_states(ids))[ids[0]].status == "running")
    doomed.kill()  # kill -9 in the middle of the task
    doomed.wait()
    rescuer = start_worker(env)
    try:
        wait_for(lambda: db.run(conn, core.task_states(ids))[ids[0]].status == "succeeded")
    finally:
        stop(rescuer)
    ((task_id, _, attempt, pid, _, _),) = logged(conn)
    assert (task_id, attempt) == (ids[0], 2)
    assert pid == rescuer.pid


def test_sigterm_under_load_loses_and_strands_nothing(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    sleep, async_sleep = producer.tasks["sleep"], producer.tasks["async_sleep"]
    calls = [
        (sleep if i % 2 else async_sleep).using(tenant=f"t{i % 4}").prepare(0.05)
        for i in range(150)
    ]
    ids = enqueue(conn, producer, calls)
    workers = [start_worker(env, "--concurrency", "4") for _ in range(2)]
    # Both at work (a worker still starting up dies of the signal, holding nothing).
    wait_for(lambda: {w.pid for w in workers} <= {row[3] for row in logged(conn)})
    for worker in workers:
        stop(worker)  # SIGTERM mid-load
        assert worker.returncode == 0, worker.errors()
    assert conn.execute("SELECT count(*) FROM rota.running").fetchone() == (0,)
    survivor = start_worker(env, "--concurrency", "8")
    try:
        wait_for(
            lambda: all(
                s.status == "succeeded" for s in db.run(conn, core.task_states(ids)).values()
            ),
            60,
        )
    finally:
        stop(survivor)
    done = {row[0] for row in logged(conn)}
    assert done == set(ids)


def test_concurrency_limit_holds_across_three_workers(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    db.transact(conn, core.configure_tenant("capped", concurrency_limit=2))
    sleep = producer.tasks["sleep"]
    enqueue(
        conn,
        producer,
        [sleep.using(tenant="capped").prepare(0.1) for _ in range(30)]
        + [sleep.using(tenant="free").prepare(0.1) for _ in range(30)],
    )
    workers = [start_worker(env, "--concurrency", "4", "--batch-size", "4") for _ in range(3)]
    try:
        wait_for(lambda: len(logged(conn)) == 60, 60)
    finally:
        for worker in workers:
            stop(worker)
    intervals = [(row[4], row[5]) for row in logged(conn) if row[1] == "capped"]
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert peak == 2  # reached, never exceeded
    assert len({row[3] for row in logged(conn)}) >= 2  # the work really was spread


def test_retries_backoff_dead_letters_timeouts_and_unknown_tasks(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    ids = enqueue(
        conn,
        producer,
        [
            producer.tasks["flaky"].using(tenant="a").prepare(1),
            producer.tasks["boom"].using(tenant="a").prepare(),
            producer.tasks["too_slow"].using(tenant="a").prepare(),
        ],
    )
    ids += producer.enqueue_many([TaskCall("nobody.knows", "a", queue="work")], connection=conn)
    env = {
        **env,
        "ROTA_UNKNOWN_TASK_GRACE_SECONDS": "1",
        "ROTA_UNKNOWN_TASK_RETRY_SECONDS": "0.2",
    }
    worker = start_worker(env)
    try:
        wait_for(
            lambda: (
                {s.status for s in db.run(conn, core.task_states(ids)).values()}
                <= {"succeeded", "dead"}
            )
        )
    finally:
        stop(worker)
    states = db.run(conn, core.task_states(ids))
    flaky, boom, slow, unknown = (states[i] for i in ids)
    assert (flaky.status, flaky.attempts) == ("succeeded", 2)
    assert (boom.status, boom.attempts) == ("dead", 2)
    assert "ValueError: boom" in (boom.last_error or "")
    assert slow.status == "dead" and "timed out" in (slow.last_error or "")
    # Handed back (no attempt used) until unknown for the grace, then dead.
    assert (unknown.status, unknown.attempts) == ("dead", 1)
    assert "unknown task" in (unknown.last_error or "")
    ((unknown_for,),) = conn.execute(
        "SELECT extract(epoch FROM finished_at - unknown_since) FROM rota.tasks WHERE id = %s",
        [unknown.id],
    ).fetchall()
    assert unknown_for >= 1


def test_cron_fires_once_per_tick_with_two_schedulers(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    import threading
    from datetime import UTC, datetime

    from rota.consumer import Maintenance
    from tests.acceptance.workapp import app as workapp

    # Two schedulers fire at the same moment, repeatedly, on their own connections
    # (no maintenance lock here: the deterministic ids alone must hold).
    now = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)
    fired: list[int] = []
    start = threading.Barrier(2)

    def scheduler() -> None:
        duty = Maintenance(settings, workapp)
        with psycopg.connect(settings.database_url, autocommit=True) as own:
            start.wait()
            for _ in range(3):
                fired.append(duty.fire_cron(own, now))

    threads = [threading.Thread(target=scheduler) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ticks = int(settings.cron_lookback_seconds // 60)
    assert sum(fired) == ticks
    rows = conn.execute("SELECT payload FROM rota.tasks WHERE name = 'every_minute'").fetchall()
    assert len(rows) == ticks
    assert len({row[0]["args"][-1] for row in rows}) == ticks


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_tasks_that_outlive_the_shutdown_grace_are_handed_back_and_the_worker_exits(
    pool: str, env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    ids = enqueue(conn, producer, [producer.tasks["sleep"].using(tenant="a").prepare(30)])
    worker = start_worker({**env, "ROTA_SHUTDOWN_GRACE_SECONDS": "1"}, "--pool", pool)
    wait_for(lambda: db.run(conn, core.task_states(ids))[ids[0]].status == "running")
    worker.stop(signal.SIGTERM, timeout=15)  # the grace, not the task's 30 s
    assert worker.returncode == 0
    state = db.run(conn, core.task_states(ids))[ids[0]]
    assert (state.status, state.attempts) == ("pending", 0)  # handed back, no attempt used


def test_workers_and_rota_maintenance_run_through_pgbouncer_in_transaction_mode(
    env: dict[str, str],
    producer: App,
    conn: psycopg.Connection[Any],
    postgres_server: Server,
    database_url: str,
) -> None:
    from rota_tools.devservers import local_pgbouncer
    from tests.integration.test_pgbouncer import _role_settings

    _role_settings(database_url)
    sleep = producer.tasks["sleep"]
    ids = enqueue(
        conn, producer, [sleep.using(tenant=f"t{i % 5}").prepare(0.01) for i in range(200)]
    )
    with local_pgbouncer(postgres_server, "transaction") as bouncer:
        pooled = {
            **env,
            "ROTA_DATABASE_URL": f"{bouncer.url}/{database_url.rsplit('/', 1)[1]}",
            "ROTA_DATABASE_POOLING": "transaction",
            # LISTEN and the maintenance lock need sessions: a direct URL.
            "ROTA_DIRECT_DATABASE_URL": database_url,
        }
        workers = [start_worker(pooled, "--concurrency", "4") for _ in range(2)]
        sidecar = start_logged([sys.executable, "-m", "rota", "maintenance"], env=pooled, cwd=ROOT)
        try:
            wait_for(
                lambda: all(
                    s.status == "succeeded" for s in db.run(conn, core.task_states(ids)).values()
                ),
                timeout=60,
                what="every task run through the pooler",
            )
        finally:
            for process in [*workers, sidecar]:
                stop(process)
    for process in [*workers, sidecar]:
        assert process.returncode == 0, process.errors()
    runs = logged(conn)
    assert len(runs) == len({row[0] for row in runs}) == 200  # each task ran once
