"""A PostgreSQL failover under load: a primary and a synchronous streaming
standby from the machine's PostgreSQL, a producer, a loader and two workers
on a two-host URL (`target_session_attrs=read-write`); the standby is
promoted mid-load and the old primary killed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from rota import App, Settings, db, ops
from rota.migrate import migrate
from rota_tools.devservers import (
    Server,
    local_redis,
    start_postgres,
    start_postgres_standby,
)
from tests.acceptance.workapp import LOG_TABLE
from tests.helpers import wait_for

ROOT = Path(__file__).parent.parent.parent
# Every process works against the new primary this soon after the promotion.
BACK_WITHIN_SECONDS = 20.0


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    primary = start_postgres()
    standby: Server | None = None
    try:
        with psycopg.connect(primary.url, autocommit=True) as conn:
            migrate(conn)
            conn.execute(LOG_TABLE)
        standby = start_postgres_standby(primary, synchronous=True)
        yield primary, standby
    finally:
        for server in (standby, primary):
            if server is not None:
                server.stop()


def _overlapping_runs(conn: psycopg.Connection[Any]) -> int:
    """Pairs of runs of one task that overlapped in time (a task run twice at once)."""
    row = conn.execute(
        "SELECT count(*) FROM test_log a JOIN test_log b ON a.task_id = b.task_id"
        " AND a.attempt < b.attempt AND a.started < b.ended AND b.started < a.ended"
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_failover_mid_load_loses_no_acknowledged_task_and_runs_none_twice_at_once(
    pair: tuple[Server, Server],
) -> None:
    from tests.acceptance import workapp

    primary, standby = pair
    url = (
        f"postgresql://rota@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
        "?target_session_attrs=read-write&connect_timeout=2"
    )
    with local_redis() as redis_server:
        settings = Settings(database_url=url, redis_url=redis_server.url, shards=2)
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "ROTA_DATABASE_URL": url,
            "ROTA_REDIS_URL": redis_server.url,
            "ROTA_SHARDS": "2",
            "ROTA_POLL_SECONDS": "0.2",
            "ROTA_HEARTBEAT_SECONDS": "0.5",
            "ROTA_LEASE_SECONDS": "5",
            "ROTA_MAINTENANCE_SECONDS": "0.2",
            "ROTA_WORKER_DEAD_AFTER_SECONDS": "3",
            # Claims wait for the standby too: a claim the failover forgot
            # would let a second worker run the task while the first still does.
            "ROTA_WORKER_SYNCHRONOUS_COMMIT": "true",
        }
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "rota", *args],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for args in (
                ["loader", "run", "--engine", "python"],
                *[["worker", "--app", "tests.acceptance.workapp:app", "--queues", "work"]] * 2,
            )
        ]
        app = App(settings)
        for task in workapp.app.tasks.values():
            app.tasks[task.name] = task
        acknowledged: list[UUID] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def produce() -> None:
            number = 0
            while not stop.is_set():
                try:
                    call = app.tasks["sleep"].call(0.05, tenant=f"t{number % 10}")
                    acknowledged.extend(app.enqueue_many([call]))
                except Exception as exc:  # an enqueue that raised was not acknowledged
                    failures.append(exc)
                number += 1
                time.sleep(0.005)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            with psycopg.connect(primary.url, autocommit=True) as old:
                wait_for(
                    lambda: old.execute("SELECT count(*) FROM test_log").fetchone()[0] > 50,  # type: ignore[index]
                    timeout=60,
                    what="tasks running before the failover",
                )
            with psycopg.connect(standby.url, autocommit=True) as new:
                new.execute("SELECT pg_promote()")
            promoted = time.monotonic()
            primary.kill()  # the old primary is gone for good
            with psycopg.connect(standby.url, autocommit=True) as new:
                ran_before = new.execute("SELECT count(*) FROM test_log").fetchone()

                def new_tasks_run() -> bool:
                    row = new.execute("SELECT count(*) FROM test_log").fetchone()
                    return bool(row and ran_before and row[0] > ran_before[0] + 20)

                wait_for(new_tasks_run, timeout=60, what="tasks run on the new primary")
                back_after = time.monotonic() - promoted
                time.sleep(1)
                stop.set()
                producer.join()
                app.close()
                wait_for(
                    lambda: (
                        all(
                            s.status == "succeeded"
                            for s in db.run(new, ops.task_states(acknowledged)).values()
                        )
                        and len(db.run(new, ops.task_states(acknowledged))) == len(acknowledged)
                    ),
                    timeout=120,
                    what="every acknowledged task run on the new primary",
                )
                overlapping = _overlapping_runs(new)
        finally:
            stop.set()
            # Shown when the test fails: what the producer met, what each process said.
            print("acknowledged", len(acknowledged), "enqueues refused", failures[:3])
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=60)
                if process.stderr is not None:  # shown when the test fails
                    print(process.args[3:5], process.stderr.read().decode()[-3000:])

    assert back_after <= BACK_WITHIN_SECONDS, back_after
    assert overlapping == 0  # no task ran twice at once
    assert not failures and len(acknowledged) > 100  # every enqueue was acknowledged
