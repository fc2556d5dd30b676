"""A worker (and the `rota maintenance` sidecar) ride out a PostgreSQL restart:
heartbeats, maintenance and LISTEN come back by themselves, each outage is
logged when it starts and when it ends, and nothing is declared dead."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import App, Settings, core
from rota.core import db
from rota.core.migrate import migrate
from rota_tools.devservers import Server, local_postgres
from tests.acceptance.conftest import ROOT
from tests.acceptance.workapp import LOG_TABLE
from tests.helpers import LoggedProcess, start_logged, wait_for


@pytest.fixture
def own_postgres() -> Iterator[Server]:
    """A server of this test's own: it is stopped and started again."""
    with local_postgres() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            migrate(conn)
            conn.execute(LOG_TABLE)
        yield server


def _start(env: dict[str, str], *args: str) -> LoggedProcess:
    return start_logged([sys.executable, "-m", "rota", *args], env=env, cwd=ROOT)


def _states(url: str, ids: list[Any]) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {s.status for s in db.run(conn, core.task_states(ids)).values()}


@pytest.mark.parametrize("maintenance", ["in-worker", "sidecar"])
def test_a_postgres_restart_is_ridden_out(
    own_postgres: Server, redis_url: str, maintenance: str
) -> None:
    url = own_postgres.url
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": url,
        "ROTA_REDIS_URL": redis_url,
        "ROTA_POLL_SECONDS": "0.2",
        "ROTA_HEARTBEAT_SECONDS": "0.5",
        "ROTA_MAINTENANCE_SECONDS": "0.2",
        "ROTA_WORKER_DEAD_AFTER_SECONDS": "3",
        "ROTA_DATABASE_TIMEOUT_SECONDS": "2",
        "PYTHONPATH": str(ROOT),
    }
    loops = ("claims and reports", "LISTEN") + (
        ("heartbeat and maintenance",) if maintenance == "in-worker" else ()
    )
    worker_args = ["worker", "--app", "tests.acceptance.workapp:app"]
    processes = {}
    if maintenance == "sidecar":
        worker_args.append("--no-maintenance")
        processes["sidecar"] = _start(env, "maintenance", "--app", "tests.acceptance.workapp:app")
    processes["worker"] = _start(env, *worker_args)
    from tests.acceptance import workapp

    app = App(Settings(database_url=url, redis_url=redis_url))
    app.tasks.update(workapp.app.tasks)
    sleep = app.tasks["sleep"]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            before = app.enqueue_many([sleep.using(tenant="a").prepare(0)] * 5, connection=conn)
        wait_for(lambda: _states(url, before) == {"succeeded"})
        with psycopg.connect(url, autocommit=True) as conn:  # maintenance has a leader
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    ).fetchone()
                    == (1,)
                )
            )

        own_postgres.stop_immediately()  # pg_ctl -m immediate
        time.sleep(3)  # the outage: longer than the worker-dead timeout
        own_postgres.start_again()

        with psycopg.connect(url, autocommit=True) as conn:
            later = app.enqueue_many(
                [
                    sleep.using(tenant="a", countdown=1).prepare(0),
                    sleep.using(tenant="b").prepare(0),
                ],
                connection=conn,
            )
        # Claims, promotion (maintenance) and heartbeats all came back.
        wait_for(lambda: _states(url, later) == {"succeeded"}, timeout=60)
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE query ~ 'LISTEN rota_(ready|cancel)'"
                    ).fetchone()
                    == (1,)
                )
            )
            assert conn.execute(
                "SELECT count(*) FROM rota.workers WHERE stopped_at IS NOT NULL"
            ).fetchone() == (0,)  # never declared dead
        # A loop says its outage ended once a round of it completes (the
        # heartbeat's first round after the restart runs the maintenance duties).
        wait_for(
            lambda: all(
                f"PostgreSQL ({loop}) reachable again" in processes["worker"].errors()
                for loop in loops
            ),
            timeout=30,
            what="each loop's outage logged as ended",
        )
        assert all(p.poll() is None for p in processes.values())
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.stop(None, timeout=30)  # SIGTERM sent above; killed if still running
        logs = {name: p.errors() for name, p in processes.items()}
        app.close()
    assert all(p.returncode == 0 for p in processes.values()), logs
    worker_log = logs["worker"]
    for loop in loops:
        # One line when the outage starts, one when it ends: not one per try.
        assert worker_log.count(f"PostgreSQL ({loop}) unavailable") == 1, worker_log
        assert worker_log.count(f"PostgreSQL ({loop}) reachable again") == 1, worker_log
    if maintenance == "sidecar":
        assert logs["sidecar"].count("PostgreSQL (maintenance) unavailable") == 1, logs["sidecar"]
        assert logs["sidecar"].count("runs the maintenance duties") == 2  # won again


def test_a_restart_while_a_worker_registers_is_ridden_out(
    own_postgres: Server, redis_url: str
) -> None:
    """The server goes away between the worker's connect and its
    registration: the worker connects again, registers and runs tasks."""
    url = own_postgres.url
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": url,
        "ROTA_REDIS_URL": redis_url,
        "ROTA_POLL_SECONDS": "0.2",
        "PYTHONPATH": str(ROOT),
    }
    from tests.acceptance import workapp

    app = App(Settings(database_url=url, redis_url=redis_url))
    app.tasks.update(workapp.app.tasks)
    blocker = psycopg.connect(url)
    # The registration's INSERT waits for this lock until the restart.
    blocker.execute("LOCK TABLE rota.workers IN SHARE MODE")
    worker = _start(env, "worker", "--app", "tests.acceptance.workapp:app")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE query ~ 'register_worker' AND wait_event_type = 'Lock'"
                    ).fetchone()
                    == (1,)
                ),
                what="the worker's registration waiting",
            )
        own_postgres.stop_immediately()
        own_postgres.start_again()
        with psycopg.connect(url, autocommit=True) as conn:
            ids = app.enqueue_many(
                [workapp.app.tasks["sleep"].using(tenant="a").prepare(0)], connection=conn
            )
            wait_for(
                lambda: worker.poll() is not None or _states(url, ids) == {"succeeded"},
                timeout=60,
                what="the task run",
            )
            assert worker.poll() is None, worker.errors()
            registered = conn.execute("SELECT count(*) FROM rota.workers").fetchone()
        assert registered == (1,)
    finally:
        blocker.close()
        worker.terminate()
        worker.stop(None, timeout=30)
        app.close()
    assert worker.returncode == 0, worker.errors()
