"""Maintenance duties against a real PostgreSQL, each alone."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from rota import Settings, core
from rota.consumer.maintenance import Maintenance, TickResult
from rota.core import db
from tests.helpers import claim, envelopes, load

Conn = psycopg.Connection[Any]


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _duty(settings: Settings, name: str, clock: Clock | None = None) -> Any:
    maintenance = Maintenance(settings, clock=clock or Clock())
    (duty,) = [d for d in maintenance.duties if d.name == name]
    return maintenance, duty


def _count(conn: Conn, table: str, where: str = "true") -> int:
    (count,) = conn.execute(f"SELECT count(*) FROM rota.{table} WHERE {where}").fetchone() or (0,)
    return int(count)


def test_retention_prunes_what_is_old_and_keeps_the_rest(conn: Conn) -> None:
    settings = Settings(
        finished_retention="7d",
        dead_retention="30d",
        worker_retention="1d",
        loader_ledger_retention="1d",
    )
    load(conn, envelopes("a", 6, max_attempts=1))
    tasks = claim(conn, 6)
    db.run(conn, core.complete([t.token for t in tasks[:3]]))
    db.run(conn, core.fail([core.Failure(t.id, t.attempt, "boom") for t in tasks[3:]]))
    # Two of each are old, one is recent.
    conn.execute(
        "UPDATE rota.finished SET finished_at = now() - interval '8 days' WHERE task_id = ANY(%s)",
        [[t.id for t in tasks[:2]]],
    )
    conn.execute(
        "UPDATE rota.tasks SET finished_at = now() - interval '31 days' WHERE id = ANY(%s)",
        [[t.id for t in tasks[3:5]]],
    )
    for name, stopped in (("old", "now() - interval '2 days'"), ("new", "now()")):
        db.run(conn, core.register_worker(name, "h", 1, ["default"], 1))
        conn.execute(f"UPDATE rota.workers SET stopped_at = {stopped} WHERE id = %s", [name])
    for batch in range(150):
        conn.execute(
            "INSERT INTO rota.loader_batches (query, batch_id, tasks, loaded_at) "
            "VALUES ('ckpt', %s, 1, now() - interval '2 days')",
            [batch],
        )
    maintenance = Maintenance(settings)
    for name in ("prune_finished", "prune_dead", "prune_workers", "prune_loader_ledger"):
        (duty,) = [d for d in maintenance.duties if d.name == name]
        duty.run(conn, TickResult())
    assert _count(conn, "finished") == 1
    assert _count(conn, "tasks", "status = 'dead'") == 1
    assert [r[0] for r in conn.execute("SELECT id FROM rota.workers")] == ["new"]
    assert _count(conn, "loader_batches") == 100  # each checkpoint keeps its newest 100


def test_retention_deletes_in_bounded_batches(conn: Conn) -> None:
    load(conn, envelopes("a", 30))
    tasks = claim(conn, 30)
    db.run(conn, core.complete([t.token for t in tasks]))
    conn.execute("UPDATE rota.finished SET finished_at = now() - interval '8 days'")
    assert db.run(conn, core.prune_finished(7 * 86400, limit=10)) == 10
    assert _count(conn, "finished") == 20


def test_a_new_leader_does_not_declare_silent_workers_dead_until_it_has_watched(
    conn: Conn,
) -> None:
    clock = Clock()
    settings = Settings(worker_dead_after_seconds=30)
    maintenance, duty = _duty(settings, "reap_workers", clock)
    db.run(conn, core.register_worker("quiet", "elsewhere", 1, ["default"], 1))
    conn.execute("UPDATE rota.workers SET heartbeat_at = now() - interval '5 minutes'")
    maintenance.took_over()  # e.g. its own connection just came back
    result = TickResult()
    duty.run(conn, result)
    assert result.reaped_workers == 0 and _count(conn, "workers", "stopped_at IS NULL") == 1
    clock.now += 31  # watched for as long as a worker may be silent
    duty.run(conn, result)
    assert result.reaped_workers == 1


def test_claims_left_by_a_stopped_worker_are_requeued(conn: Conn) -> None:
    settings = Settings(heartbeat_seconds=1)
    load(conn, envelopes("a", 2))
    db.run(conn, core.register_worker("gone", "elsewhere", 1, ["default"], 1))
    (task, _) = claim(conn, 2, worker="gone")
    db.run(conn, core.stop_worker("gone"))  # then died before reporting
    conn.execute("UPDATE rota.workers SET stopped_at = now() - interval '10 seconds'")
    _, duty = _duty(settings, "reap_workers")
    result = TickResult()
    duty.run(conn, result)
    assert result.requeued_from_dead == 2
    assert db.run(conn, core.task_states([task.id]))[task.id].status == "pending"


def test_promotion_is_atomic_and_a_lock_timeout_is_not_a_lost_connection(
    conn: Conn, settings: Settings, database_url: str
) -> None:
    from datetime import UTC, datetime

    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1)
    due = datetime.now(UTC)
    db.transact(conn, core.fail([core.Failure(task.id, task.attempt, "again", retry_at=due)]))
    assert _count(conn, "scheduled") == 1
    clock = Clock()
    maintenance = Maintenance(settings, clock=clock)
    with psycopg.connect(database_url) as locker:
        # Another transaction holds the tenant's tag: promotion must wait for it.
        locker.execute("SELECT 1 FROM rota.tenant_queues FOR UPDATE")
        conn.execute("SET lock_timeout = '200ms'")
        try:
            maintenance.tick(conn)  # the duties that time out are logged, not raised
        finally:
            conn.execute("RESET lock_timeout")
        assert not conn.closed
        # Taken off the schedule and put in line in one transaction, or neither.
        assert _count(conn, "scheduled") == 1 and _count(conn, "ready") == 0
    clock.now += 3600
    assert maintenance.tick(conn).promoted == 1
    assert _count(conn, "scheduled") == 0 and _count(conn, "ready") == 1
    assert [t.id for t in claim(conn, 1)] == [task.id]


def test_a_worker_declared_dead_while_cut_off_keeps_its_leases_rejoins_and_is_refused_after(
    conn: Conn,
) -> None:
    key = core.WorkerKey.new("cut-off")
    db.run(conn, core.register_worker(key, "elsewhere", 1, ["default"], 1))
    load(conn, envelopes("a", 2))
    kept, lapsed = db.transact(conn, core.claim(["default"], 2, key.id, 60.0))
    # Silent past the dead-after time (a partition): declared dead. It may
    # still be running both: only the one whose lease passed is requeued.
    conn.execute("UPDATE rota.workers SET heartbeat_at = now() - interval '5 minutes'")
    conn.execute(
        "UPDATE rota.running SET lease_expires_at = now() - interval '1 second' WHERE task_id = %s",
        [lapsed.id],
    )
    assert db.run(conn, core.reap_workers([key.id])) == {lapsed.id}
    states = db.run(conn, core.task_states([kept.id, lapsed.id]))
    assert (states[kept.id].status, states[lapsed.id].status) == ("running", "pending")
    # Nor does the stopped workers' sweep take the other before its lease passes.
    assert db.run(conn, core.reap_stopped_workers_claims(0)) == set()
    assert db.run(conn, core.worker_heartbeat(key)) is False
    assert db.run(conn, core.rejoin_worker(key)) is True
    assert db.run(conn, core.worker_heartbeat(key)) is True
    # Back: the task it held under its lease is still its; the other is not.
    assert db.transact(conn, core.complete([kept.token], key)) == {kept.id}
    assert db.transact(conn, core.complete([lapsed.token], key)) == set()
    (again,) = db.transact(conn, core.claim(["default"], 1, key.id, 60.0))
    assert again.id == lapsed.id and again.attempt == lapsed.attempt + 1
    assert db.transact(conn, core.complete([again.token], key)) == {lapsed.id}


def test_a_worker_whose_process_is_gone_has_its_tasks_requeued_at_once(conn: Conn) -> None:
    key = core.WorkerKey.new("gone")
    db.run(conn, core.register_worker(key, "elsewhere", 1, ["default"], 1, heartbeat_seconds=1))
    load(conn, envelopes("a", 1))
    (task,) = db.transact(conn, core.claim(["default"], 1, key.id, 60.0))
    # Within two heartbeats of its last: left alive, whoever asks.
    assert db.run(conn, core.reap_gone_workers([key.id])) == set()
    conn.execute("UPDATE rota.workers SET heartbeat_at = now() - interval '5 seconds'")
    assert db.run(conn, core.reap_gone_workers([key.id])) == {task.id}  # its lease or not
    assert db.run(conn, core.task_states([task.id]))[task.id].status == "pending"
    # A record pruned meanwhile: it cannot rejoin (it stops).
    conn.execute("DELETE FROM rota.workers WHERE id = %s", [key.id])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.run(conn, core.rejoin_worker(key))
