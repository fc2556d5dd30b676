"""Two services on one database: a worker never kills the other's tasks."""

from __future__ import annotations

import sys
from typing import Any

import psycopg

from rota import App, TaskCall, core
from rota.core import db
from tests.acceptance.conftest import ROOT
from tests.acceptance.test_workers import enqueue, stop
from tests.helpers import LoggedProcess, start_logged, wait_for

Conn = psycopg.Connection[Any]


def _worker(env: dict[str, str], app: str) -> LoggedProcess:
    return start_logged(
        [sys.executable, "-m", "rota", "worker", "--app", app],  # no --queues
        env=env,
        cwd=ROOT,
    )


def test_a_worker_leaves_other_services_tasks_alone(
    env: dict[str, str], producer: App, conn: Conn
) -> None:
    (mail,) = producer.enqueue_many(
        [TaskCall("mail.send", "carol", ["x@y"], queue="mail")], connection=conn
    )
    (other,) = producer.enqueue_many(
        [TaskCall("other.task", "carol", ["hi"], queue="work")], connection=conn
    )
    mine = enqueue(conn, producer, [producer.tasks["sleep"].using(tenant="carol").prepare(0)])
    env = {
        **env,
        "ROTA_UNKNOWN_TASK_RETRY_SECONDS": "0.2",
        "ROTA_UNKNOWN_TASK_GRACE_SECONDS": "600",
    }
    worker = _worker(env, "tests.acceptance.workapp:app")
    try:
        wait_for(lambda: db.run(conn, core.task_states(mine))[mine[0]].status == "succeeded")
        # Handed back at least once by the worker that does not know it...
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT unknown_since IS NOT NULL FROM rota.tasks WHERE id = %s", [other]
                ).fetchone()
                == (True,)
            )
        )
        states = db.run(conn, core.task_states([mail, other]))
        # ...never dead, no attempt used; the queue `mail` is not its app's: untouched.
        assert states[other].status in {"pending", "scheduled", "running"}
        assert states[other].attempts == 0
        assert (states[mail].status, states[mail].attempts) == ("pending", 0)
        knower = _worker(env, "tests.acceptance.otherapp:app")
        try:
            wait_for(lambda: db.run(conn, core.task_states([other]))[other].status == "succeeded")
        finally:
            stop(knower)
    finally:
        stop(worker)
    assert db.run(conn, core.task_states([mail]))[mail].status == "pending"
