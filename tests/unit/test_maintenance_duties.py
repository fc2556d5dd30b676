"""Maintenance duties, each on its own interval, each failing alone."""

from __future__ import annotations

from typing import Any

import psycopg

from rota.consumer.maintenance import Maintenance, TickResult
from rota.settings import Settings


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _maintenance(clock: Clock, **settings: Any) -> tuple[Maintenance, list[str]]:
    ran: list[str] = []
    duty = Maintenance(Settings(**settings), clock=clock)
    for d in duty.duties:
        d.run = lambda conn, result, name=d.name: ran.append(name)  # type: ignore[misc]
    return duty, ran


def test_each_duty_runs_on_its_own_interval() -> None:
    clock = Clock()
    duty, ran = _maintenance(
        clock, maintenance_seconds=1, promote_seconds=0.5, cron_seconds=10, retention_seconds=60
    )
    conn: Any = None
    duty.tick(conn)
    assert set(ran) == {d.name for d in duty.duties}  # all due at first
    ran.clear()
    clock.now += 0.6
    duty.tick(conn)
    assert ran == ["promote"]
    ran.clear()
    clock.now += 0.6
    duty.tick(conn)
    assert ran == ["promote", "expire_leases", "reap_workers"]
    ran.clear()
    clock.now += 60
    duty.tick(conn)
    assert "cron" in ran and "prune_dead" in ran and "prune_finished" in ran


class Connection:
    """What the tick asks of a connection: whether it is still there."""

    def __init__(self) -> None:
        self.closed = False
        self.broken = False


def test_a_failing_duty_does_not_stop_the_others_but_a_lost_connection_does() -> None:
    clock = Clock()
    duty, ran = _maintenance(clock)
    conn = Connection()

    def broken(conn: Any, result: TickResult) -> None:
        raise ValueError("bad row")

    duty.duties[0].run = broken
    duty.tick(conn)  # type: ignore[arg-type]
    assert len(ran) == len(duty.duties) - 1

    def deadlocked(conn: Any, result: TickResult) -> None:
        raise psycopg.errors.DeadlockDetected("deadlock detected")  # an OperationalError

    duty.duties[0].run = deadlocked
    clock.now += 100
    ran.clear()
    duty.tick(conn)  # type: ignore[arg-type]
    assert len(ran) == len(duty.duties) - 1  # the connection is fine: only that duty failed

    def lost(conn: Any, result: TickResult) -> None:
        conn.broken = True
        raise psycopg.OperationalError("server closed the connection")

    duty.duties[0].run = lost
    clock.now += 100
    ran.clear()
    try:
        duty.tick(conn)  # type: ignore[arg-type]
    except psycopg.OperationalError:
        pass
    else:
        raise AssertionError("a lost connection must reach the caller (it reconnects)")
    assert ran == []


def test_a_new_leader_judges_no_silence_before_it_has_watched() -> None:
    clock = Clock()
    duty, _ = _maintenance(clock, worker_dead_after_seconds=30)
    duty.took_over()
    assert clock() < duty.judge_silence_after == 130
