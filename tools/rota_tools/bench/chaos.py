"""`rota bench chaos`: faults under load, and the total-queue rule checked.

Real processes on throwaway servers (a producer recording each id `enqueue`
returned, across 50 tenants, one of them limited; a Python loader; two
workers) and, after a fault-free baseline, faults one after another under
load (`_faults`): kill -9 of each process, Redis killed and restarted from
its append-only file, PostgreSQL stopped and started again, and unreachable
past a lease. Then everything drains and the history the tasks left is
checked (rota_tools.bench.faults).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rota_tools.bench.faults import (
    LEASE_SECONDS,
    LOADER,
    TENANTS,
    WORKER,
    Fault,
    Fleet,
    history_report,
    leadership_overlaps,
    prepare_database,
)
from rota_tools.devservers import local_postgres, local_redis


def run_chaos(
    *,
    rate: float = 150.0,
    seconds_per_task: float = 0.02,
    baseline_seconds: float = 20.0,
    settle_seconds: float = 15.0,
    pg_pause_seconds: float = 10.0,
    spark: bool = False,
    faults_enabled: bool = True,
) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(local_postgres())
        rd = stack.enter_context(local_redis(appendfsync="always"))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rota-chaos-")))
        prepare_database(pg.url)
        fleet = stack.enter_context(Fleet(workdir, pg, rd))
        fleet.add("loader", *LOADER)
        fleet.add("worker1", *WORKER)
        fleet.add("worker2", *WORKER)
        fleet.add_producer(rate, seconds_per_task)
        fleet.started(60)
        fleet.measure_baseline(baseline_seconds)
        always_up = _faults(fleet, settle_seconds, pg_pause_seconds, spark, faults_enabled)
        return history_report(fleet, time.time(), leadership_overlaps(fleet), always_up, rate)


def _faults(
    fleet: Fleet, settle_seconds: float, pg_pause_seconds: float, spark: bool, enabled: bool
) -> bool:
    """The faults, one after another under load; whether every process
    stayed up."""
    always_up = True

    def fault(name: str, cause: str, act: Callable[[], None]) -> None:
        nonlocal always_up
        started = time.time()
        if enabled:
            act()  # else the same schedule without the fault, as a reference
        always_up = (
            fleet.fault(Fault(name, started, time.time(), cause), settle_seconds) and always_up
        )

    def pg_outage(pause: float) -> None:
        fleet.pg_stops.append(time.time())
        fleet.pg.stop_immediately()
        time.sleep(pause)
        fleet.pg.start_again()

    def redis_crash() -> None:
        fleet.rd.kill()
        time.sleep(2)
        fleet.rd.start_again()

    fault("kill -9 loader (python)", "loader", lambda: fleet.kill("loader"))
    fault("kill -9 worker mid-task", "worker", lambda: fleet.kill("worker2"))
    fault("kill -9 producer mid-burst", "producer", lambda: fleet.kill("producer"))
    fault("kill -9 maintenance leader", "worker", lambda: fleet.kill(fleet.leader() or "worker1"))
    fault("redis kill -9, restart from AOF", "redis", redis_crash)
    pause = pg_pause_seconds
    fault(f"postgres -m immediate, back after {pause:g} s", "postgres", lambda: pg_outage(pause))
    fault("postgres unreachable past a lease", "postgres", lambda: pg_outage(LEASE_SECONDS + 3))
    if spark:
        fleet.stop("loader")
        fleet.add("loader", "loader", "run", "--checkpoint", str(fleet.workdir / "ckpt"))
        time.sleep(settle_seconds * 2)  # the JVM's start
        fault("kill -9 loader (spark)", "loader", lambda: fleet.kill("loader"))
        time.sleep(settle_seconds)  # the restarted JVM's start
        fault("postgres -m immediate under the Spark loader", "postgres", lambda: pg_outage(pause))
    return always_up


def produce(ids_dir: Path, rate: float, seconds_per_task: float) -> None:
    """The producer process: single enqueues at `rate`, across the tenants,
    each id written (and flushed) once `enqueue` returned it."""
    from rota.errors import CapacityExceeded, EnqueueError
    from rota_tools.bench.chaosapp import keyed_work, work

    out = (ids_dir / f"{os.getpid()}.ids").open("a")
    started = time.perf_counter()
    sent = 0
    while True:
        tenant = f"t{sent % TENANTS}"
        with contextlib.suppress(EnqueueError, CapacityExceeded):
            # Every fifth, across the tenants, calls the shared downstream.
            task = keyed_work if sent % 5 == 0 else work
            task_id = task.using(tenant=tenant).enqueue(seconds_per_task)
            out.write(f"{task_id}\n")
            out.flush()
        sent += 1
        time.sleep(max(0.0, started + sent / rate - time.perf_counter()))


if __name__ == "__main__":
    produce(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
