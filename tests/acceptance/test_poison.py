"""One tenant sends every kind of poison among 20 tenants' ordinary work: two
real worker processes stay up, every ordinary task completes exactly once,
and each poison task ends dead with its reason."""

from __future__ import annotations

from typing import Any

import psycopg

from rota import App, TaskCall, core
from rota.core import db
from tests.acceptance.test_workers import enqueue, logged, start_worker, stop
from tests.helpers import wait_for

Conn = psycopg.Connection[Any]


def _poison(conn: Conn, producer: App) -> dict[str, Any]:
    """Each kind of poison, by name: task ids of the tenant `mallory`."""
    tasks = producer.tasks
    by_call = {
        name: tasks[name].using(tenant="mallory").prepare()
        for name in (
            "retry_in_a_trillion_seconds",
            "retry_soon_ish",
            "exits",
            "interrupts",
            "unprintable",
            "fails_once_stored",
        )
    }
    ids = dict(zip(by_call, enqueue(conn, producer, list(by_call.values())), strict=True))
    (ids["unknown"],) = producer.enqueue_many(
        [TaskCall("nobody.knows.this", "mallory", queue="work")], connection=conn
    )
    (ids["year_10000"],) = enqueue(
        conn, producer, [tasks["sleep"].using(tenant="mallory").prepare(0)]
    )
    # Rows stored before today's rules (the CHECKs are NOT VALID: old rows
    # stay): a time a client cannot read, and a backoff no interval can hold.
    conn.execute("ALTER TABLE rota.tasks DROP CONSTRAINT enqueued_at_bounded")
    conn.execute("ALTER TABLE rota.tasks DROP CONSTRAINT backoff_bounded")
    conn.execute(
        "UPDATE rota.tasks SET enqueued_at = '9999-12-31 23:00:00-14' WHERE id = %s",
        [ids["year_10000"]],
    )
    conn.execute(
        "UPDATE rota.tasks SET backoff_base = 1e300, backoff_max = 1e300 WHERE id = %s",
        [ids["fails_once_stored"]],
    )
    return ids


def test_poison_from_one_tenant_hurts_no_other_and_stops_no_worker(
    env: dict[str, str],
    producer: App,
    conn: Conn,
) -> None:
    sleep = producer.tasks["sleep"]
    ordinary = enqueue(
        conn, producer, [sleep.using(tenant=f"t{i % 20}").prepare(0.005) for i in range(400)]
    )
    poison = _poison(conn, producer)
    env = {**env, "ROTA_UNKNOWN_TASK_GRACE_SECONDS": "1", "ROTA_UNKNOWN_TASK_RETRY_SECONDS": "0.2"}
    workers = [start_worker(env, "--concurrency", "4", "--batch-size", "10") for _ in range(2)]
    everything = ordinary + list(poison.values())
    try:
        wait_for(
            lambda: (
                {s.status for s in db.run(conn, core.task_states(everything)).values()}
                <= {"succeeded", "dead"}
            ),
            timeout=90,
        )
        assert [w.poll() for w in workers] == [None, None]  # both up the whole time
    finally:
        for worker in workers:
            stop(worker)
    assert [w.returncode for w in workers] == [0, 0]

    states = db.run(conn, core.task_states(everything))
    assert {states[i].status for i in ordinary} == {"succeeded"}
    runs = [row[0] for row in logged(conn) if row[0] in set(ordinary)]
    assert sorted(runs) == sorted(ordinary)  # each ran exactly once

    reasons = {kind: (states[i].status, states[i].last_error or "") for kind, i in poison.items()}
    assert {status for status, _ in reasons.values()} == {"dead"}
    expected = {
        "retry_in_a_trillion_seconds": "Retry countdown must be",
        "retry_soon_ish": "Retry countdown must be",
        "exits": "SystemExit",
        "interrupts": "TaskAborted: the task raised KeyboardInterrupt",
        "unprintable": "Unprintable",
        "fails_once_stored": "its outcome could not be stored",
        "unknown": "unknown task",
        "year_10000": "claimed, but could not be read",
    }
    for kind, says in expected.items():
        assert says in reasons[kind][1], (kind, reasons[kind])
