"""A worker's heartbeat thread: every ROTA_HEARTBEAT_SECONDS it extends the
leases of the tasks in flight, keeps the worker's row alive (rejoining if it
was declared dead while cut off) and records the runs' seconds; and it runs
the maintenance duties while the worker holds their lock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from rota import core
from rota.consumer.maintenance import Leadership
from rota.core import connections, db, versions
from rota.runtime.outage import Kept, Outage, run_rounds
from rota.settings import Settings

if TYPE_CHECKING:
    from rota.consumer.worker import Worker

log = logging.getLogger("rota.worker")


def heartbeat(
    settings: Settings,
    worker_id: str,
    beat: Callable[[psycopg.Connection[Any]], None],
    leadership: Leadership | None,
    stopping: threading.Event,
) -> None:
    """Calls `beat` (extend leases, keep the worker's row alive) every
    ROTA_HEARTBEAT_SECONDS, and runs the maintenance duties while `leadership`
    holds their lock, which lives on this thread's connection: leadership is
    lost with it. Until `stopping`; reconnects after a lost connection."""
    last_beat = float("-inf")
    # Which worker holds the maintenance lock: its id, in pg_stat_activity.
    conn = Kept(
        lambda: versions.ready(
            connections.connect(settings, "heartbeat", who=worker_id), stopping.is_set
        )
    )

    def beat_and_maintain() -> float:
        nonlocal last_beat
        if time.monotonic() - last_beat >= settings.heartbeat_seconds:
            beat(conn.get())
            last_beat = time.monotonic()
        if leadership is not None:
            leadership.tick(conn.get())
        return settings.maintenance_seconds

    def lost(_error: BaseException) -> None:
        conn.drop()
        if leadership is not None:
            leadership.connection_lost()

    try:
        run_rounds(
            beat_and_maintain,
            Outage("PostgreSQL (heartbeat and maintenance)", log),
            db.SERVER_LOST,
            stopping,
            lost=lost,
            carry_on="heartbeat or maintenance",
            pause_after_crash=settings.maintenance_seconds,
        )
    finally:
        conn.drop()


def beat(worker: Worker, conn: psycopg.Connection[Any]) -> None:
    """One heartbeat of `worker`: its row kept alive, its leases extended,
    its runs' seconds recorded; tasks whose lease was lost end as cancelled."""
    beat_started = time.monotonic()
    if not db.run(conn, core.worker_heartbeat(worker.key)) and not worker.stopping.is_set():
        # Declared dead while cut off: what it held stays its until the
        # leases pass (then its reports of it are refused); it claims again.
        if db.run(conn, core.rejoin_worker(worker.key)):
            log.warning("worker %s was declared dead while cut off; it rejoins", worker.id)
        else:
            log.error("worker %s was declared dead and its record is gone; stopping", worker.id)
            worker.stop()
    flights = list(worker.in_flight.values())
    tokens = [f.task.token for f in flights]
    # The runs begun, marked started (the console tells them from prefetched claims).
    started = {f.task.id: s for f in flights if (s := f.started_after()) is not None}
    lease = worker.settings.lease_seconds
    held = db.run(conn, core.extend_leases(tokens, lease, worker.key, started)) if tokens else set()
    # Each lease held was renewed at the server after the beat began.
    for task_id, attempt in tokens:
        flight = worker.in_flight.get(task_id)
        if task_id in held and flight is not None and flight.task.attempt == attempt:
            flight.leased_from = max(flight.leased_from, beat_started)
    # Runs' seconds since the last beat (queues charged by time cost by them).
    times, worker.run_times = worker.run_times, {}
    if times:
        db.run(conn, core.record_run_times(times))
    # Only tasks still in flight count: one that finished meanwhile left
    # the running table without losing anything.
    lost = [t for t, _ in tokens if t not in held and t in worker.in_flight]
    if lost:
        # Another worker may hold them now: they end as if cancelled (not
        # started if they were not; a running one is asked to stop).
        log.warning(
            "%d lease(s) lost: not starting those waiting, stopping those running, "
            "their results refused",
            len(lost),
        )
        for task_id in lost:
            worker.cancel_asked(task_id)
