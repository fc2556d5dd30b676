"""`rota bench work --pool processes`: the process pool beside the thread
pool, on CPU-bound tasks (where processes use every core) and on no-op tasks
(what a task's trip to a child costs); runs alternate, medians reported."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import psycopg

from rota import Settings
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.harness import (
    NOOP_APP,
    QUEUE,
    finished,
    load,
    reset,
    stopping,
    wait_for_finished,
)
from rota_tools.processes import spawn_workers

POOLS = ("threads", "processes")
# About 20 ms of pure-Python arithmetic per task on this project's machines.
CRUNCH_ROUNDS = 300_000


def _rate(
    conn: psycopg.Connection[Any],
    settings: Settings,
    pool: str,
    name: str,
    args: list[Any],
    tasks: int,
    concurrency: int,
) -> float:
    """Tasks/s of one worker process with `pool`, once it is up (its first
    `concurrency` tasks, which start the children, are not timed)."""
    reset(conn)
    load(
        conn,
        [
            make_envelope(name=name, queue=QUEUE, tenant=f"t{i % 10}", args=args)
            for i in range(tasks)
        ],
    )
    spawned = spawn_workers(
        NOOP_APP,
        [QUEUE],
        1,
        settings,
        concurrency=concurrency,
        batch_size=min(100, 4 * concurrency),
        pool=pool,
    )
    with stopping(spawned) as workers:
        wait_for_finished(conn, min(tasks // 10, 2 * concurrency), workers)
        begin, started = finished(conn), time.perf_counter()
        wait_for_finished(conn, tasks, workers, drained=True)
        return (tasks - begin) / (time.perf_counter() - started)


def bench_pools(settings: Settings, cpu_tasks: int, noop_tasks: int, runs: int) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    cpu: dict[str, list[float]] = {pool: [] for pool in POOLS}
    noop: dict[str, list[float]] = {pool: [] for pool in POOLS}
    with db.connect(settings.database_url) as conn:
        for _ in range(runs):
            for pool in POOLS:
                cpu[pool].append(
                    _rate(conn, settings, pool, "crunch", [CRUNCH_ROUNDS], cpu_tasks, cores)
                )
                noop[pool].append(_rate(conn, settings, pool, "noop", [], noop_tasks, 8))

    def figures(rates: dict[str, list[float]]) -> dict[str, Any]:
        medians = {pool: statistics.median(rates[pool]) for pool in POOLS}
        return {
            "tasks_per_s": {pool: round(medians[pool], 1) for pool in POOLS},
            "runs": {pool: [round(r, 1) for r in rates[pool]] for pool in POOLS},
            "processes_to_threads": round(medians["processes"] / medians["threads"], 3),
        }

    return {
        "params": {
            "cores": cores,
            "runs": runs,
            "cpu_bound_tasks": cpu_tasks,
            "crunch_rounds": CRUNCH_ROUNDS,
            "cpu_bound_concurrency": cores,
            "noop_tasks": noop_tasks,
            "noop_concurrency": 8,
        },
        "cpu_bound": figures(cpu),
        "noop": figures(noop),
        "goal": {"cpu_bound_processes_to_threads_at_least": 1.8},
    }
