"""Workflows with real workers: each group's join runs once all its members
succeeded, with their results, through kill -9 of a worker and a
PostgreSQL restart in the middle of the members; a chain passes each result
on."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import rota
from rota import App, Settings, core
from rota.core import db
from rota.core.migrate import migrate
from rota_tools.devservers import Server, local_postgres
from tests.acceptance.conftest import ROOT
from tests.acceptance.workapp import LOG_TABLE, plus, square, total
from tests.helpers import LoggedProcess, start_logged, wait_for

GROUPS, MEMBERS = 8, 40


@pytest.fixture
def own_postgres() -> Iterator[Server]:
    """A server of this test's own: it is stopped and started again."""
    with local_postgres() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            migrate(conn)
            conn.execute(LOG_TABLE)
        yield server


def _worker(env: dict[str, str]) -> LoggedProcess:
    return start_logged(
        [sys.executable, "-m", "rota", "worker", "--app", "tests.acceptance.workapp:app"],
        env=env,
        cwd=ROOT,
    )


def _logged(url: str) -> list[tuple[Any, ...]]:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            return conn.execute("SELECT task_id, started, ended FROM test_log").fetchall()
    except psycopg.OperationalError:
        return []


def test_joins_run_once_with_their_results_through_kill_9_and_a_postgres_restart(
    own_postgres: Server, redis_url: str
) -> None:
    url = own_postgres.url
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": url,
        "ROTA_REDIS_URL": redis_url,
        "ROTA_POLL_SECONDS": "0.2",
        "ROTA_HEARTBEAT_SECONDS": "0.5",
        "ROTA_LEASE_SECONDS": "3",
        "ROTA_MAINTENANCE_SECONDS": "0.2",
        "ROTA_WORKER_DEAD_AFTER_SECONDS": "2",
        "ROTA_DATABASE_TIMEOUT_SECONDS": "2",
        "PYTHONPATH": str(ROOT),
    }
    app = App(Settings(database_url=url, redis_url=redis_url))
    flows = [
        rota.group(*(square.using(tenant=f"t{g}").prepare(m) for m in range(MEMBERS))).then(
            total.using(tenant=f"t{g}").receiving(f"group {g}")
        )
        for g in range(GROUPS)
    ]
    joins = [app.enqueue_workflow(flow).last for flow in flows]
    workers = [_worker(env) for _ in range(3)]
    try:
        wait_for(
            lambda: len(_logged(url)) >= GROUPS * MEMBERS // 4, what="a quarter of the members"
        )
        workers[0].process.send_signal(signal.SIGKILL)
        own_postgres.stop_immediately()
        time.sleep(1)
        own_postgres.start_again()
        workers.append(_worker(env))

        def ended() -> bool:
            with psycopg.connect(url, autocommit=True) as conn:
                states = db.run(conn, core.task_states(joins))
            return all(s.status == "succeeded" for s in states.values())

        wait_for(ended, timeout=120, what="every join to succeed")
    finally:
        for worker in workers:
            worker.stop(signal.SIGTERM, timeout=30)
        app.close()
    runs: dict[Any, list[tuple[float, float]]] = {}
    for task_id, started, finished in _logged(url):
        runs.setdefault(task_id, []).append((started, finished))
    with psycopg.connect(url, autocommit=True) as conn:
        for join in joins:
            members = conn.execute(
                "SELECT task_id FROM rota.members WHERE join_id = %s", (join,)
            ).fetchall()
            assert len(members) == MEMBERS
            # One run of the join (an attempt cut short by the kill logs
            # nothing), after every member's last run ended.
            (run,) = runs[join]
            assert run[0] >= max(end for (m,) in members for _, end in runs[m])
            # Its result: the sum of its members' squares, every one passed on.
            kept = conn.execute("SELECT value FROM rota.results WHERE task_id = %s", (join,))
            assert kept.fetchone() == (sum(m * m for m in range(MEMBERS)),)


def test_a_chain_passes_each_result_on(
    env: dict[str, str], settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    app = App(settings)
    stored = app.enqueue_workflow(
        rota.chain(
            square.using(tenant="c").prepare(3),
            plus.using(tenant="c").receiving(1),
            plus.using(tenant="c").receiving(10),
        )
    )
    worker = _worker(env)
    try:
        assert app.result(stored.last).get(timeout=60) == 20  # 3 * 3 + 1 + 10
    finally:
        worker.stop(signal.SIGTERM, timeout=30)
        app.close()
