"""The worker's reports (completions, failures) against a real PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from rota import App, Settings, core
from rota.consumer.heartbeat import beat
from rota.consumer.worker import InFlight, Outcome, Worker
from rota.core import db


def _worker_with_tasks(
    app: App, conn: psycopg.Connection[Any], count: int, **options: Any
) -> tuple[Worker, list[Any]]:
    """A registered worker (not started) and the ids of `count` tasks of
    alice's, enqueued in that order."""
    parse_pdf = app.tasks["parse_pdf"]
    ids = [
        parse_pdf.using(tenant="alice", connection=conn).enqueue(f"{i}.pdf") for i in range(count)
    ]
    worker = Worker(app, queues=["pdfs"], maintenance=False, **options)
    db.run(conn, core.register_worker(worker.key, "host", 1, ["pdfs"], count))
    return worker, ids


def test_outcomes_outlive_a_lost_connection_and_are_reported_after_reconnecting(
    app: App, settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    worker, ids = _worker_with_tasks(app, conn, 3)
    claimed = db.run(conn, core.claim(["pdfs"], 3, worker.key))
    assert [t.id for t in claimed] == ids
    for task, error in zip(claimed, [None, None, ValueError("bad page")], strict=True):
        worker.in_flight[task.id] = InFlight(task, timeout=None)
        worker.outcomes.append(Outcome(task, error))

    lost = db.connect(settings.database_url)
    conn.execute("SELECT pg_terminate_backend(%s)", [lost.info.backend_pid])
    with pytest.raises(psycopg.OperationalError):
        worker._report(lost)
    states = db.run(conn, core.task_states(ids))
    assert {s.status for s in states.values()} == {"running"}  # nothing reported yet

    with db.connect(settings.database_url) as again:
        worker._report(again)
    states = db.run(conn, core.task_states(ids))
    assert [states[i].status for i in ids] == ["succeeded", "succeeded", "scheduled"]
    assert worker.processed == 3


def test_completions_sent_with_a_refused_claim_are_reported_apart_next(
    app: App, settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    worker, ids = _worker_with_tasks(app, conn, 4, batch_size=2)
    done = db.run(conn, core.claim(["pdfs"], 2, worker.key))
    for task in done:
        worker.in_flight[task.id] = InFlight(task, timeout=None)
        worker.outcomes.append(Outcome(task, None))
    # The database refuses the statement that completes and claims (this
    # database is the test's own).
    signature = (
        "rota.complete_claim(uuid[], integer[], text[], integer, text, double precision,"
        " double precision[], double precision[])"
    )
    conn.execute(f"DROP FUNCTION {signature}")
    conn.execute(
        f"CREATE FUNCTION {signature} RETURNS TABLE (id uuid, name text, payload text, queue text, "
        "tenant text, attempt integer, max_attempts integer, lease_expires_at timestamptz, "
        "enqueued_at timestamptz, completed integer, claimed boolean) LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused'; END $$"
    )
    with db.connect(settings.database_url) as worker_conn:
        worker._step(worker_conn, ["pdfs"])
        states = db.run(conn, core.task_states(ids))
        # Nothing stored, and the finished tasks are not taken for the
        # refused claim's: none was handed back to run again.
        assert [states[i].status for i in ids] == ["running", "running", "pending", "pending"]
        assert worker.narrowing == 1
        worker._step(worker_conn, ["pdfs"])  # reported on their own, then a claim of one
    states = db.run(conn, core.task_states(ids))
    assert [states[i].status for i in ids] == ["succeeded", "succeeded", "running", "pending"]
    assert worker.processed == 2 and len(worker.in_flight) == 1


def test_a_task_whose_lease_a_heartbeat_finds_lost_never_starts_and_held_ones_are_renewed(
    app: App, settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    worker, ids = _worker_with_tasks(app, conn, 2)
    held, lost = db.run(conn, core.claim(["pdfs"], 2, worker.key))
    sent = time.monotonic() - 50  # both prefetched, claimed 50 s ago
    for task in (held, lost):
        worker.in_flight[task.id] = InFlight(task, timeout=None, leased_from=sent)
    # The second's lease passed and another worker took it meanwhile.
    conn.execute(
        "UPDATE rota.running SET lease_expires_at = now() - interval '1 second' WHERE task_id = %s",
        [lost.id],
    )
    assert db.run(conn, core.requeue_expired()) == {lost.id}
    (taken,) = db.run(conn, core.claim(["pdfs"], 1, "other-worker"))
    assert taken.id == lost.id

    before = time.monotonic()
    beat(worker, conn)
    assert worker.in_flight[held.id].leased_from >= before  # renewed from the beat
    assert worker.in_flight[lost.id].leased_from == sent
    # The lost one ends as if cancelled before it started: handed back, not run.
    assert list(worker.cancels) == [lost.id]
    worker._apply_cancels()
    assert set(worker.in_flight) == {held.id}
    assert worker.unreported.stale == [lost.token]
    states = db.run(conn, core.task_states(ids))
    assert states[lost.id].status == "running"  # the other worker's, untouched
    worker._pool.shutdown()
